"""Prompt snapshots on a layout with recurrent state whose paged regions all slide.

There, prefixes are reused only through snapshots (pages alone do not hold the state), and a
request drops its pages outside the window as its history grows. A long prompt has released its
leading pages by the time its boundary is reached: no snapshot can hold them, so none is published
there (as a final checkpoint of a request that released pages is not), and the request runs on.
"""

from __future__ import annotations

from helios.runtime.records.events import FinishReason

from .fake_model import reference
from .harness import assert_all_released, make, spec

WINDOW = 8
PROMPT = list(range(1, 31))  # two prompt chunks of 16 tokens: the first releases pages


def test_a_prompt_that_released_pages_publishes_no_prompt_snapshot_and_runs_on():
    scheduler, driver = make(stateful=True, window=WINDOW, page_tokens=2, num_pages=64, prefill_tokens=16)
    driver.submit(spec("a", PROMPT, 6))
    outcome = driver.run()["a"]
    assert outcome.tokens == reference(PROMPT, 6, stateful=True, window=WINDOW)
    assert outcome.finish.reason == FinishReason.LENGTH
    assert scheduler.counters().snapshots_published == 0
    assert_all_released(scheduler)
    scheduler.check_invariants()
