"""A Qwen3-Next core (Gated DeltaNet + gated attention, experts with a gated shared expert) prepared,
signed and served by the generic runtime: the contract's recurrent region holds the delta rule's
[Hv, Dk, Dv] state rows; greedy tokens equal transformers' (float32), batched; a shared
prompt prefix is restored from a snapshot (state rows and partial page copied back) with the same
tokens as a cold run."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import transformers

from helios.contract import StartupOptions
from helios.contract import serving_pb2 as spb
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.records.plan import StorageKind
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import QWEN3_NEXT
from runtime.test_hybrid_runtime import prepare_signed

NAMESPACE = "test.helios/qwen3-next"
STEPS = 16
PREFIX = [17, 40, 41, 99, 5, 6, 7, 8, 120, 121, 122, 200, 201, 3, 9, 11, 12, 13, 14, 15, 16, 30]
PROMPTS = [PREFIX[:13], PREFIX + [50, 51, 52], [7, 8, 9]]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    return _prepared(tmp_path_factory.getbasetemp())


@functools.cache
def _prepared(base: Path):
    root = base / "qwen3-next-runtime"
    root.mkdir()
    checkpoint = prepare_signed(QWEN3_NEXT, root, NAMESPACE, prefill_chunks=())  # prompt programs of 32 tokens only
    return root, transformers.AutoModelForCausalLM.from_pretrained(checkpoint).float().eval()


def is_greedy(reference, prompt: list[int], tokens: list[int]) -> bool:
    """Whether `tokens` is transformers' greedy continuation of `prompt` for STEPS tokens: each is its
    argmax after the prompt and the tokens before it (one float32 forward over both; the recurrent
    layers' state after a prefix is the same in one forward as step by step)."""
    with torch.no_grad():
        ids = torch.tensor([prompt + tokens[:-1]])
        logits = reference(ids, attention_mask=torch.ones_like(ids)).logits
    return len(tokens) == STEPS and tokens == logits[0, len(prompt) - 1:].argmax(-1).tolist()


def _runtime(root: Path, concurrency=None):
    core = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    load = LoadOptions(startup=StartupOptions(max_concurrency=concurrency), device="cpu")
    return build_runtime(core, RuntimeOptions(load=load))


def test_the_contract_declares_the_delta_rule_state_rows(served):
    root, _ = served
    runtime = _runtime(root)
    prepared = runtime.engine.executor.model.prepared
    regions = {r.name: r for r in prepared.contract.model.cache.regions}
    assert regions["recurrent"].kind == spb.HISTORY_KIND_RECURRENT
    assert list(regions["recurrent"].planes) == ["conv_state", "ssm_state"]
    _, state = runtime.engine.executor.storage.planes(StorageKind.STATE)
    conv, rule = (p.tensor for p in state)
    # two linear-attention layers; conv channels 2 * 2 * 8 + 4 * 12, window 3; state [Hv, Dk, Dv] float32
    assert tuple(conv.shape[2:]) == (80, 3) and conv.shape[0] == 2
    assert tuple(rule.shape[2:]) == (4, 8, 12) and rule.dtype == torch.float32


def test_greedy_tokens_equal_transformers_batched(served):
    root, reference = served
    batched = _runtime(root)
    for prompt, result in zip(PROMPTS, generate(batched.engine, PROMPTS, STEPS), strict=True):
        assert is_greedy(reference, prompt, list(result.token_ids)), prompt


def test_a_shared_prefix_restores_a_snapshot_with_the_same_tokens(served):
    root, reference = served
    runtime = _runtime(root)
    generate(runtime.engine, [PROMPTS[0]], STEPS)  # publishes a snapshot at its prompt boundary
    assert runtime.engine.scheduler.counters().snapshots_published > 0
    warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
    assert is_greedy(reference, PROMPTS[1], list(warm.token_ids))
    counters = runtime.engine.scheduler.counters()
    assert counters.snapshots_restored == 1 and counters.prefix_reused_tokens >= len(PROMPTS[0])
