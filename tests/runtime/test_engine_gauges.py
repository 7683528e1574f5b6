"""The engine's gauges hold from its construction: what /metrics reports before the first round."""

from __future__ import annotations

from helios.runtime.service import build_runtime

from .test_model_fixture import open_fixture


def test_a_new_engine_reports_every_page_free_before_its_first_round():
    """A server that had run no request reported ``helios_cache_pages_free 0`` of its pages (the
    gauge was first read after a round), so free + cached fell short of the total while idle."""
    engine = build_runtime(open_fixture()).engine
    snapshot = engine.stats.snapshot()
    assert snapshot.pages_total > 0
    assert (snapshot.pages_free, snapshot.pages_cached) == (snapshot.pages_total, 0)
    assert (snapshot.active_requests, snapshot.queued_requests) == (0, 0)
