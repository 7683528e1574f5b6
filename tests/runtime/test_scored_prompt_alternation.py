"""Scored prompts (prompt scores: SCORED_PREFILL) and plain prompts alternate step by step. When the
operation whose turn it is schedules nothing, because its waiting head cannot be admitted (no
pages, or it waits for a running request computing its prompt) and it has no running lane, the
step runs the other kind's running lanes instead: a scored prompt whose next chunk waited on a
plain request that could not be admitted, or on one waiting for the scored prompt itself (a prompt
group), or a plain prompt behind a scored head, stalled the scheduler for good, the alternation
choosing the empty operation at every step."""

from __future__ import annotations

from helios.runtime.records.capacities import Operation

from .fake_model import reference
from .harness import assert_all_released, make, spec


def operations(driver) -> list[tuple[str, list[tuple[str, int, int]]]]:
    return [(plan.operation.name, [(r.request_id, r.start_pos, r.query_len) for r in plan.rows])
            for plan in driver.plans]


def test_a_scored_prompt_goes_on_while_a_plain_head_cannot_be_admitted():
    scheduler, driver = make(max_active=4, num_pages=12, prefill_tokens=16)
    cached = list(range(1, 25))
    driver.submit(spec("a", cached, 1))
    driver.run()  # its 6 complete pages stay parked in the prefix cache
    scored, plain = list(range(50, 80)), cached + list(range(60, 76))
    driver.submit(spec("s", scored, 2, score_prompt=True), spec("w", plain, 2))
    driver.run()
    # w's admission retains its 6 cached pages and then finds no 4 fresh ones beside s's 4: s's
    # second chunk runs in its place (before: no plan at all, s and w waiting forever)
    assert operations(driver)[2:4] == [("SCORED_PREFILL", [("s", 0, 16)]), ("SCORED_PREFILL", [("s", 16, 14)])]
    assert driver.outcomes["s"].tokens == reference(scored, 2)
    assert driver.outcomes["w"].tokens == reference(plain, 2)
    assert_all_released(scheduler)


def test_a_plain_prompt_goes_on_while_a_scored_head_cannot_be_admitted():
    scheduler, driver = make(max_active=4, num_pages=12, prefill_tokens=32)
    plain, scored = list(range(1, 41)), list(range(50, 70))
    driver.submit(spec("p", plain, 2))
    driver.step()  # p's first chunk: 8 of the 12 pages
    driver.submit(spec("h", scored, 2, score_prompt=True))
    driver.run()
    # h's turn, but its first chunk needs 5 pages: p's second chunk runs instead
    assert operations(driver)[1] == ("MIXED", [("p", 32, 8)])
    assert [plan.operation for plan in driver.plans].count(Operation.SCORED_PREFILL) == 1
    assert driver.outcomes["p"].tokens == reference(plain, 2)
    assert driver.outcomes["h"].tokens == reference(scored, 2)
    assert_all_released(scheduler)


def test_a_plain_request_waiting_for_a_scored_source_of_its_prompt():
    """A scored request (echo with logprobs) and a plain one with the same prompt: the plain one
    waits for the scored one's prompt (prompt groups), so the prompt step whose turn it is after each
    scored chunk has nothing to run; the scored chunks go on, then the plain request shares the
    prompt (before: the scheduler stalled after the first scored chunk, with pages to spare)."""
    scheduler, driver = make(max_active=4, num_pages=64, prefill_tokens=16)
    prompt = list(range(1, 41))
    driver.submit(spec("s", prompt, 2, score_prompt=True), spec("m", prompt, 2))
    driver.run()
    assert operations(driver) == [
        ("SCORED_PREFILL", [("s", 0, 16)]), ("SCORED_PREFILL", [("s", 16, 16)]), ("SCORED_PREFILL", [("s", 32, 8)]),
        ("DECODE", [("s", 40, 1), ("m", 39, 1)]), ("DECODE", [("m", 40, 1)])]
    assert driver.outcomes["s"].tokens == driver.outcomes["m"].tokens == reference(prompt, 2)
    assert_all_released(scheduler)
