"""A snapshot is published once per state: requests that reach the same state at once (the choices of
one request, a popular prompt sent twice) capture it once.

On a layout with recurrent state the snapshots are the only prefix reuse, and each one holds a
continuation row of the few the core has (two per request slot). A second capture of a state that is
already published, or still being captured for publication, would only take a row from another
snapshot: the least recently used one, evicted, so a conversation waiting for its next turn would
lose its state.
"""

from __future__ import annotations

from .fake_model import reference
from .harness import assert_all_released, make, spec

EARLIER = list(range(40, 50))
PROMPT = list(range(1, 12))
STABLE = 6  # the stable prefix's end: a second snapshot per prompt


def test_choices_of_one_prompt_publish_its_snapshots_once_and_keep_other_conversations():
    scheduler, driver = make(stateful=True, max_active=4, num_pages=64, rows=4)
    driver.submit(spec("earlier", EARLIER, 3))
    driver.run()  # publishes the earlier prompt's state (one continuation row)
    driver.submit(*(spec(f"choice{i}", PROMPT, 4, stable_prefix_len=STABLE) for i in range(4)))
    driver.run()  # the four choices prefill in one step, each reaching both of their prompt's boundaries
    snapshots = scheduler.cache.snapshots.snapshots()
    assert sorted(s.endpoint for s in snapshots) == [STABLE, len(EARLIER), len(PROMPT)]
    assert scheduler.counters().snapshots_evicted == 0
    driver.submit(spec("next turn", EARLIER + [7, 8], 3))
    outcomes = driver.run()
    assert outcomes["next turn"].tokens == reference(EARLIER + [7, 8], 3, stateful=True)
    assert scheduler.queues.requests == {} and scheduler.counters().snapshots_restored == 1
    for index in range(4):
        assert outcomes[f"choice{index}"].tokens == reference(PROMPT, 4, stateful=True)
    assert_all_released(scheduler)


def test_equal_final_states_are_published_once():
    """Two requests that end in the same state (the same prompt and greedy answer, each publishing its
    end) leave one snapshot of it beside their prompt's."""
    scheduler, driver = make(stateful=True, max_active=4, num_pages=64, rows=4)
    driver.submit(*(spec(f"same{i}", PROMPT, 5, publish_snapshot=True) for i in range(2)))
    driver.run()
    endpoints = sorted(s.endpoint for s in scheduler.cache.snapshots.snapshots())
    assert endpoints == [len(PROMPT), len(PROMPT) + 4]
    assert_all_released(scheduler)
