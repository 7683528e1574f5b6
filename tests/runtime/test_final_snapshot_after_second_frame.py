"""A final snapshot after a second execution frame ran past the request's EOS.

With two frames a decode round is planned behind the one in flight before its token is known. When
that token is an EOS id, the trailing round still feeds it (the device owns the pending token) and
advances the slot's recurrent state by its position. A request that publishes its end
(`publish_snapshot`) must then publish state and endpoint together: a later turn that continues
the conversation restores the snapshot and gives the tokens it gives alone.
"""

from __future__ import annotations

from helios.runtime.records.events import FinishReason

from .fake_model import reference
from .harness import assert_all_released, make, spec

PROMPT = list(range(1, 11))


def test_a_snapshot_published_after_a_trailing_round_restores_the_state_at_its_endpoint():
    scheduler, driver = make(stateful=True, max_active=4, num_pages=64)
    alone = reference(PROMPT, 12, stateful=True)
    eos = alone[3]  # the fourth token, absent from the first three: the request ends there
    assert eos not in alone[:3]
    driver.submit(spec("first", PROMPT, 12, eos_ids=frozenset({eos}), publish_snapshot=True))
    first = driver.run()["first"]
    assert first.tokens == alone[:4] and first.finish.reason == FinishReason.EOS
    eos_position = len(PROMPT) + 3  # a round behind the EOS fed it there
    assert any(row.request_id == "first" and row.start_pos == eos_position and row.pending_on_device
               for plan in driver.plans for row in plan.rows)

    turn = PROMPT + alone[:4] + [50, 51, 52]  # the conversation so far, then the next message
    driver.submit(spec("turn", turn, 5))
    assert driver.run()["turn"].tokens == reference(turn, 5, stateful=True)
    assert scheduler.counters().snapshots_restored == 1
    assert_all_released(scheduler)
    scheduler.check_invariants()


def test_a_request_whose_trailing_round_failed_publishes_no_end():
    """The round behind the EOS fails after its program ran (the device state moved on, how far is
    unknown): the request keeps its EOS end, and nothing of that state is published for a turn."""
    scheduler, driver = make(stateful=True, max_active=4, num_pages=64)
    alone = reference(PROMPT, 12, stateful=True)
    eos_position = len(PROMPT) + 3
    driver.fail_next = lambda plan: any(row.request_id == "first" and row.start_pos == eos_position
                                        for row in plan.rows)
    driver.submit(spec("first", PROMPT, 12, eos_ids=frozenset({alone[3]}), publish_snapshot=True))
    first = driver.run()["first"]
    assert first.tokens == alone[:4] and first.finish.reason == FinishReason.EOS
    assert [s.endpoint for s in scheduler.cache.snapshots.snapshots()] == [len(PROMPT)]  # the prompt's only

    driver.fail_next = None
    turn = PROMPT + alone[:4] + [50, 51, 52]
    driver.submit(spec("turn", turn, 5))
    assert driver.run()["turn"].tokens == reference(turn, 5, stateful=True)
    assert_all_released(scheduler)
    scheduler.check_invariants()
