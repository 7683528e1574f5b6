"""Capacities validation, variant selection and typed admission rejections."""

from __future__ import annotations

import pytest

from helios.errors import AdmissionRejected, LoadError
from helios.runtime.scheduling import admission
from helios.runtime.records.capacities import (CacheGeometry, Capacities, Operation, PageTableView, ProgramVariant,
                                       StorageLayout)

from .harness import capacities, make, spec


def test_capacities_reject_unservable_geometry():
    layout = StorageLayout(4)
    decode = ProgramVariant("d", Operation.DECODE, 4, 4)
    prefill = ProgramVariant("p", Operation.PREFILL, 4, 32)
    geometry = CacheGeometry(layout, 16, 8)
    Capacities(4, 64, 32, 100, (decode, prefill), geometry)
    cases = [
        dict(max_active=8),  # no decode program holds 8 lanes
        dict(prefill_tokens=64),  # no prefill program holds the extent
        dict(variants=(prefill,)),
        dict(cache=CacheGeometry(layout, 4, 8)),
        dict(variants=(ProgramVariant("d", Operation.DECODE, 4, 8), prefill)),
        dict(variants=(decode, prefill, ProgramVariant("s", Operation.SPECULATIVE, 4, 2, 1, 2))),
    ]
    for case in cases:
        values = dict(max_active=4, context_tokens=64, prefill_tokens=32, vocab_size=100,
                      variants=(decode, prefill), cache=geometry) | case
        with pytest.raises(LoadError):
            Capacities(**values)


def test_select_picks_the_smallest_fitting_variant():
    caps = capacities(max_active=8, prefill_tokens=64)
    assert caps.select(Operation.DECODE, 1, 1).name == "decode1"
    assert caps.select(Operation.DECODE, 3, 3).name == "decode4"
    assert caps.select(Operation.DECODE, 5, 5).name == "decode8"
    assert caps.select(Operation.DECODE, 9, 9) is None
    assert caps.select(Operation.PREFILL, 2, 16).name == "prefill16"
    assert caps.select(Operation.PREFILL, 2, 17).name == "prefill64"
    assert caps.limits(Operation.MIXED) == (8, 64)
    assert caps.select(Operation.SPECULATIVE, 1, 1) is None


def test_layout_pages_include_shifted_views():
    layout = StorageLayout(4, views=(PageTableView("kv"), PageTableView("draft", page_offset=1)))
    assert [layout.pages_for(n) for n in (0, 1, 4, 5)] == [0, 2, 2, 3]


@pytest.mark.parametrize("item, error", [
    (spec("a", [], 4), admission.InvalidShape),
    (spec("a", [1], 0), admission.InvalidShape),
    (spec("a", [1, 200], 4), admission.TokenOutOfRange),
    (spec("a", [1] * 200, 60), admission.ContextExceeded),
    (spec("a", [1], 4, stop_strings=("a", "b", "c", "d", "e")), admission.StopLimitExceeded),
    (spec("a", [1], 4, stop_strings=("",)), admission.StopLimitExceeded),
    (spec("a", [1], 4, stop_strings=("x" * 4097,)), admission.StopLimitExceeded),
    (spec("a", [1], 4, stop_token_sequences=((1,),) * 17), admission.StopLimitExceeded),
    (spec("a", [1], 4, stop_token_sequences=(tuple(range(65)),)), admission.StopLimitExceeded),
    (spec("a", [1], 4, stop_token_sequences=((500,),)), admission.TokenOutOfRange),
    (spec("a", [1], 4, logit_bias=((3, 1.0), (3, 2.0))), admission.InvalidLogitBias),
    (spec("a", [1], 4, logit_bias=((97, 1.0),)), admission.InvalidLogitBias),
    (spec("a", [1], 4, logit_bias=((-1, 1.0),)), admission.InvalidLogitBias),
    (spec("a", [1], 4, logit_bias=tuple((token, 1.0) for token in range(5))), admission.InvalidLogitBias),  # width 4
    (spec("a", [1], 4, eos_ids=frozenset({100})), admission.TokenOutOfRange),
    (spec("a", [1], 4, eos_ids=frozenset({-1, 2})), admission.TokenOutOfRange),
    (spec("a", [1], 4, logit_bias=((3, float("nan")),)), admission.InvalidLogitBias),
    (spec("a", [1], 4, logit_bias=((3, float("inf")),)), admission.InvalidLogitBias),
    (spec("a", [1], 4, logit_bias=((3, 1.0), (4, -float("inf")))), admission.InvalidLogitBias),
])
def test_requests_outside_capacities_are_rejected(item, error):
    scheduler, _ = make(context=256)
    with pytest.raises(error) as raised:
        scheduler.submit(item)
    assert isinstance(raised.value, AdmissionRejected) and raised.value.http_status == 503
    assert scheduler.view("a") is None


def test_distinct_logit_bias_ids_are_admitted():
    scheduler, _ = make(context=256)
    scheduler.submit(spec("a", [1], 4, logit_bias=((0, -5.0), (3, 1.0), (96, 2.0))))
    assert scheduler.view("a") is not None


def test_logit_bias_fits_the_programs_inputs():
    full = tuple((token, 1.0) for token in range(4))
    admission.check_admission(spec("a", [1], 4, logit_bias=full), capacities(logit_bias_width=4))
    admission.check_admission(spec("a", [1], 4), capacities(logit_bias_width=0))  # no bias: any core
    with pytest.raises(admission.InvalidLogitBias, match="at most 3"):
        admission.check_admission(spec("a", [1], 4, logit_bias=full), capacities(logit_bias_width=3))
    with pytest.raises(admission.UnsupportedRequest, match="no logit bias"):
        admission.check_admission(spec("a", [1], 4, logit_bias=full[:1]), capacities(logit_bias_width=0))


def test_eos_ids_fit_the_programs_that_match_them():
    """Where programs match EOS on the device their input's width bounds a request's EOS ids; where the
    host matches them (width 0) any number is admitted."""
    many = spec("a", [1], 4, eos_ids=frozenset(range(10)))
    admission.check_admission(many, capacities(eos_width=0))
    admission.check_admission(many, capacities(eos_width=10))
    with pytest.raises(admission.StopLimitExceeded, match="at most 9"):
        admission.check_admission(many, capacities(eos_width=9))


def test_cache_and_program_limits_are_admission_errors():
    scheduler, _ = make(num_pages=8, context=256)
    with pytest.raises(admission.CacheExceeded):
        scheduler.submit(spec("a", range(1, 30), 10))  # 39 tokens need 10 pages of 4
    caps = capacities()
    no_scoring = Capacities(caps.max_active, caps.context_tokens, caps.prefill_tokens, caps.vocab_size,
                            tuple(v for v in caps.variants if v.operation != Operation.SCORED_PREFILL), caps.cache)
    with pytest.raises(admission.UnsupportedRequest):
        admission.check_admission(spec("b", [1, 2], 2, score_prompt=True), no_scoring)


def test_rejection_never_disturbs_other_requests():
    scheduler, driver = make(queue=2)
    driver.submit(spec("a", range(1, 9), 4), spec("b", range(1, 5), 4))
    driver.step()
    before = scheduler.view("a")
    with pytest.raises(admission.DuplicateRequest):
        scheduler.submit(spec("a", [1], 1))
    driver.submit(spec("c", [3], 2), spec("d", [4], 2))
    with pytest.raises(admission.QueueFull):
        scheduler.submit(spec("e", [5], 2))
    assert scheduler.view("a") == before
    outcomes = driver.run()
    assert {name: o.num_finishes for name, o in outcomes.items()} == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_rejected_requests_get_a_distinct_terminal_event():
    from helios.runtime.records.events import FinishReason, rejected
    scheduler, _ = make()
    try:
        scheduler.submit(spec("a", [], 1))
    except AdmissionRejected as error:
        event = rejected("a", 0, str(error))
    assert event.reason == FinishReason.REJECTED and event.num_output_tokens == 0 and "empty" in event.message
