"""Complete speculative generation on two ranks: every rank runs the whole draft, allocates causal
prefixes from rank zero's broadcast confidence and verifies with the sharded target; greedy
tokens equal one rank's ordinary greedy tokens."""

from __future__ import annotations

import pytest

from helios.cli.main import main
from helios.runtime.offline import generate
from ignition.hf_checkpoints import QWEN3
from speculative.support import Counting, write_truncated_checkpoint

from .conftest import MAX_TOKENS, NAMESPACE, PROMPTS, running


@pytest.fixture(scope="module")
def draft_core(cores):
    checkpoint = cores.checkpoint(QWEN3)
    draft = write_truncated_checkpoint(checkpoint, cores.root / "qwen3-draft", 1)
    core = cores.root / "qwen3-draft-tp2.core"
    assert main([
        "prepare", str(checkpoint), "-o", str(core), "--key", str(cores.key), "--namespace", NAMESPACE,
        "--context-tokens", "64", "--prefill-tokens", "16", "--decode-batches", "2", "--no-mixed",
        "--draft", str(draft), "--speculative-widths", "1,4", "--allocate-prefixes", "--packed-per-lane", "2",
        "--tensor-parallel", "2", "--no-logprobs",  # no request here asks for log-probabilities
    ]) == 0
    return core


def test_two_ranks_speculate_what_one_rank_decodes(cores, draft_core):
    counting = Counting()
    with running(cores.open(draft_core)) as runtime:
        counting.wrap(runtime.engine.executor)
        results = generate(runtime.engine, PROMPTS, MAX_TOKENS)
    assert [r.finish_reason.name for r in results] == ["LENGTH"] * len(PROMPTS), [r.message for r in results]
    assert [list(r.token_ids) for r in results] == cores.reference_tokens(QWEN3)
    assert counting.rounds > 0 and counting.accepted > 0  # allocation ran on broadcast confidence
