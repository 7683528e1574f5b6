"""/metrics exposition: every runtime value appears, labels carry no request data."""

from __future__ import annotations

from helios.runtime.records.stats import WorkerStats
from helios.server.metrics import ServerMetrics


def test_runtime_values_are_exposed():
    stats = WorkerStats(pages_total=64, pages_free=60, request_slots=4)
    stats.graph_launches["decode"] += 7
    stats.mixed_grammar_decode_steps = 2
    stats.record_constrained_submission(1)
    metrics = ServerMetrics(stats.snapshot)
    metrics.http_responses.labels("chat", "429").inc()
    text = metrics.render().decode()
    assert "helios_requests_finished" not in text  # counted by the responses (`request_metrics`)
    assert 'helios_graph_launches_total{operation="decode"} 7.0' in text
    assert "helios_cache_pages 64.0" in text
    assert "flare_mixed_grammar_decode_steps_total 2.0" in text
    assert "flare_constrained_max_inflight 1.0" in text
    assert 'helios_http_responses_total{endpoint="chat",status="429"} 1.0' in text


def test_constrained_inflight_starts_at_zero():
    text = ServerMetrics(WorkerStats().snapshot).render().decode()
    assert "flare_constrained_max_inflight 0.0" in text
