"""A prompt group's members still waiting when the member holding the prompt ends at its first
token (an output limit of one, an EOS or a stop drawn first, a cancellation): the prompt is held
for them, so they are admitted together onto it and compute one prompt token each, as they would
onto a running source; the hold goes once no member waits, or under page pressure. Exact rows,
copies, outputs against the fake model's reference, and every page back after the run."""

from __future__ import annotations

from helios.runtime.records.events import FinishReason
from helios.runtime.records.plan import CopyOp, Location, StorageKind

from .fake_model import reference
from .harness import assert_all_released, make, spec
from .test_prompt_sharing import prompt_tokens

PROMPT = list(range(1, 15))  # 14 tokens over pages of 4: 3 complete pages, position 13 on page 3


def page(index: int) -> Location:
    return Location(StorageKind.PAGE, index)


def rows(plan) -> list[tuple[str, int, int]]:
    return [(r.request_id, r.start_pos, r.query_len) for r in plan.rows]


def run(specs, on_events=None, **caps):
    scheduler, driver = make(**{"max_active": 8, "num_pages": 64, **caps})
    available = scheduler.cache.pool.num_available
    driver.submit(*specs)
    driver.run(on_events)
    assert not scheduler.cache.groups.held and not scheduler.queues.num_awaiting
    assert scheduler.cache.pool.num_available == available  # every page free or parked again
    assert_all_released(scheduler)
    return scheduler, driver


def test_choices_of_a_source_ending_at_its_first_token_share_the_held_prompt():
    scheduler, driver = run([spec("c0", PROMPT, 1)] + [spec(f"c{j}", PROMPT, 1 + j) for j in range(1, 4)])
    first, second = driver.plans[:2]
    assert rows(first) == [("c0", 0, 14)]
    # c0 ended LENGTH at its first token and was released: every choice still joins at position 13
    assert rows(second) == [("c1", 13, 1), ("c2", 13, 1), ("c3", 13, 1)]
    assert second.copies == tuple(CopyOp(page(3), page(dst), 1) for dst in (4, 5, 6))
    assert prompt_tokens(driver.plans, len(PROMPT)) == 14 + 3
    for j in range(4):
        assert driver.outcomes[f"c{j}"].tokens == reference(PROMPT, 1 + j)
    assert [driver.outcomes[f"c{j}"].finish.num_reused_tokens for j in range(4)] == [0, 13, 13, 13]
    assert (scheduler.cache.groups.num_holds, scheduler.cache.groups.num_shared_admissions) == (1, 3)


def test_a_source_ending_by_eos_stop_or_cancel_at_its_first_token_leaves_the_prompt_held():
    first_token = reference(PROMPT, 1)[0]
    endings = {  # (c0's options, what ends it after its first token, its finish reason)
        "eos": ({"eos_ids": frozenset({first_token})}, None, FinishReason.EOS),
        "stop": ({}, "stop", FinishReason.STOP),
        "cancel": ({}, "cancel", FinishReason.CANCELLED),
    }
    for name, (options, end, reason) in endings.items():
        scheduler, driver = make(max_active=8, num_pages=64)
        driver.submit(spec("c0", PROMPT, 6, **options), spec("c1", PROMPT, 6), spec("c2", PROMPT, 6))
        first = scheduler.schedule()
        driver.record(scheduler.complete(first, driver.executor.run(first)))  # c0 prefilled, its first token out
        if end is not None:
            getattr(driver, end)("c0")
        assert driver.outcomes["c0"].finish.reason == reason and driver.outcomes["c0"].tokens == [first_token]
        driver.run()
        assert rows(driver.plans[0]) == [("c1", 13, 1), ("c2", 13, 1)], name
        assert driver.outcomes["c1"].tokens == driver.outcomes["c2"].tokens == reference(PROMPT, 6), name
        assert scheduler.cache.groups.num_holds == 1 and not scheduler.cache.groups.held, name
        assert_all_released(scheduler)


def test_a_prompt_shorter_than_a_page_is_computed_once():
    prompt = [5, 6, 7]
    scheduler, driver = run([spec(f"c{j}", prompt, 1) for j in range(4)])
    assert [rows(plan) for plan in driver.plans] == [[("c0", 0, 3)], [("c1", 2, 1), ("c2", 2, 1), ("c3", 2, 1)]]
    assert driver.plans[1].copies == tuple(CopyOp(page(0), page(dst), 2) for dst in (1, 2, 3))
    assert all(driver.outcomes[f"c{j}"].tokens == reference(prompt, 1) for j in range(4))


def test_a_page_aligned_prompt_holds_complete_pages_only():
    prompt = list(range(1, 14))  # 13 tokens: position 12 opens page 3, nothing to copy
    scheduler, driver = run([spec(f"c{j}", prompt, 1 + 2 * j) for j in range(3)])
    assert rows(driver.plans[1]) == [("c1", 12, 1), ("c2", 12, 1)]
    assert not any(plan.copies for plan in driver.plans)
    assert [r.new_page_ids[:3] for r in driver.plans[1].rows] == [(0, 1, 2), (0, 1, 2)]
    assert all(driver.outcomes[f"c{j}"].tokens == reference(prompt, 1 + 2 * j) for j in range(3))


def test_members_waiting_for_a_slot_keep_the_hold_until_the_last_is_admitted():
    scheduler, driver = run([spec(f"c{j}", PROMPT, 1 if j == 0 else 3) for j in range(4)], max_active=2)
    admissions = [(r.request_id, r.start_pos) for plan in driver.plans for r in plan.rows if r.admits]
    assert admissions == [("c0", 0), ("c1", 13), ("c2", 13), ("c3", 13)]
    assert prompt_tokens(driver.plans, len(PROMPT)) == 14 + 3
    assert all(driver.outcomes[f"c{j}"].tokens == reference(PROMPT, 3) for j in range(1, 4))


def test_cancelling_the_waiting_members_drops_the_hold():
    scheduler, driver = make(max_active=1, num_pages=64)
    available = scheduler.cache.pool.num_available
    driver.submit(*[spec(f"c{j}", PROMPT, 1) for j in range(3)])
    plan = scheduler.schedule()
    driver.record(scheduler.complete(plan, driver.executor.run(plan)))
    groups = scheduler.cache.groups
    assert list(groups.held.values())[0].page_ids == (0, 1, 2, 3)
    driver.cancel("c1")
    assert groups.held  # c2 still waits
    driver.cancel("c2")
    assert not groups.held and scheduler.cache.pool.num_available == available
    assert not scheduler.has_work
    assert_all_released(scheduler)


def test_page_pressure_drops_the_hold_before_anything_stalls():
    """A request queued between the choices needs every page the hold pins: the hold goes, the
    request is admitted, and the choices behind it prefill their prompt again, exactly."""
    big = list(range(30, 90))  # 60 tokens: 15 pages of 4, 16 with its output
    scheduler, driver = run([spec("c0", PROMPT, 1), spec("big", big, 4), spec("c1", PROMPT, 2),
                             spec("c2", PROMPT, 2)], num_pages=16, max_active=8, prefill_tokens=64)
    assert rows(driver.plans[1]) == [("big", 0, 60)]  # admitted past the held prompt's 4 pages
    assert rows(driver.plans[5]) == [("c1", 0, 14)]
    assert driver.outcomes["big"].tokens == reference(big, 4)
    assert all(driver.outcomes[f"c{j}"].tokens == reference(PROMPT, 2) for j in (1, 2))
    assert scheduler.cache.groups.num_holds == 1


def test_a_failed_plan_leaves_nothing_held():
    scheduler, driver = make(max_active=8, num_pages=64)
    available = scheduler.cache.pool.num_available
    driver.submit(*[spec(f"c{j}", PROMPT, 1) for j in range(3)])
    driver.fail_next = lambda plan: plan.sequence == 0
    driver.run()
    assert driver.outcomes["c0"].finish.reason == FinishReason.ERROR
    # c0's pages were never written: c1 prefills the prompt, then holds it for c2 when it ends
    assert [rows(plan) for plan in driver.plans[1:]] == [[("c1", 0, 14)], [("c2", 13, 1)]]
    assert scheduler.cache.groups.num_holds == 1
    assert all(driver.outcomes[f"c{j}"].tokens == reference(PROMPT, 1) for j in (1, 2))
    assert scheduler.cache.pool.num_available == available
    assert_all_released(scheduler)


def test_a_member_whose_page_comes_from_the_dropped_hold_copies_nothing():
    """The pool is full when c1 is admitted onto the held prompt: its one fresh page comes from
    dropping the hold, and it is the held page of the last prompt token itself, whose leading
    token is already in place (no copy of a page onto itself)."""
    x = list(range(40, 55))
    scheduler, driver = run([spec("x", x, 3), spec("c0", PROMPT, 1), spec("c1", PROMPT, 3)], num_pages=8)
    admitting = driver.plans[1]
    assert rows(admitting) == [("x", 15, 1), ("c1", 13, 1)] and admitting.rows[1].new_page_ids == (4, 5, 6, 7)
    assert not admitting.copies
    assert driver.outcomes["c1"].tokens == reference(PROMPT, 3) and driver.outcomes["x"].tokens == reference(x, 3)
