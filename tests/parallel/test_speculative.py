"""Complete speculative generation on two ranks: every rank runs the whole draft, allocates causal
prefixes from rank zero's broadcast confidence and verifies with the sharded target; greedy
tokens equal one rank's ordinary greedy tokens."""

from __future__ import annotations

import pytest

from helios.runtime.offline import generate
from ignition.hf_checkpoints import LLAMA3_UNTIED
from speculative.support import Counting

from .conftest import MAX_TOKENS, PROMPTS, running

FAMILY = LLAMA3_UNTIED


@pytest.fixture(scope="module")
def draft_core(cores):
    """test_stress_ranks' speculative two-rank core (widths 1 and 4, prefixes allocated within P = 2 a lane)."""
    from .test_stress_ranks import speculative_core

    return speculative_core(cores, FAMILY)


def test_two_ranks_speculate_what_one_rank_decodes(cores, draft_core):
    counting = Counting()
    with running(cores.open(draft_core)) as runtime:
        counting.wrap(runtime.engine.executor)
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
    assert [r.finish_reason.name for r in results] == ["LENGTH"] * len(PROMPTS), [r.message for r in results]
    assert [list(r.token_ids) for r in results] == cores.reference_tokens(FAMILY)
    assert counting.rounds > 0 and counting.accepted > 0  # allocation ran on broadcast confidence
