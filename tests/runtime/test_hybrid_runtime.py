"""A hybrid Mamba2 + attention core (BambaForCausalLM) served by the generic runtime: greedy tokens
equal transformers' (float32), alone and batched; a shared prompt prefix is restored from a
snapshot (state rows and partial page copied back) with the same tokens as a cold run; preemption
with state offload to host slots and restore gives the same tokens."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from helios.contract import StartupOptions
from helios.contract import serving_pb2 as spb
from helios.core.keys import SigningKey, write_key_pair
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.records.plan import StorageKind
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import BAMBA
from support.bamba_reference import grouped_gated_norm
from support.chat_checkpoint import write_chat_checkpoint
from support.shared_prepare import prepared_once, shared_root

NAMESPACE = "test.helios/hybrid"
STEPS = 32
PREFIX = [17, 40, 41, 99, 5, 6, 7, 8, 120, 121, 122, 200, 201, 3, 9, 11, 12, 13, 14, 15, 16, 30]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """(core directory, transformers reference), prepared once per session for every module that
    imports this fixture (test_state_graphs, test_hybrid_two_frames, test_runtime_flags)."""
    return prepared_hybrid(tmp_path_factory.getbasetemp())


@functools.cache
def prepared_hybrid(base: Path):
    # Prepared once per test run (`prepared_once`: the xdist workers share it). A failed try leaves
    # its files: the next one starts from an empty directory (write_key_pair never overwrites).
    root = shared_root(base) / "hybrid-runtime"

    def prepare() -> None:
        shutil.rmtree(root, ignore_errors=True)
        prepare_signed(BAMBA, root, NAMESPACE)
        (root / ".prepared").write_text("ok")

    prepared_once(root, root / ".prepared", prepare)
    checkpoint = root / "checkpoint"
    reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).float().eval()
    grouped_gated_norm(reference)  # Mamba2's grouped norm on transformers releases without it (the GPU machine's)
    reference.generation_config.eos_token_id = None
    return root, reference


def prepare_signed(family, root: Path, namespace: str, prefill_chunks: tuple[int, ...] = (8,)) -> Path:
    """`family`'s chat checkpoint (seed 4) written to root/checkpoint and prepared into root/model.core
    for `namespace`, signed by a fresh publisher key (root/publisher.key); returns the checkpoint
    directory. A small plan without token-logprobs programs: no request on these cores asks for
    log-probabilities (the hybrid chat core of tests/server/test_hybrid_chat_turns.py carries them),
    so each runtime loads half the programs; prompt programs of 32 tokens and of `prefill_chunks`."""
    checkpoint = write_chat_checkpoint(family, root / "checkpoint", seed=4)
    key = SigningKey.generate()
    write_key_pair(root / "publisher.key", key, [namespace])
    plan = CapacityPlan(page_tokens=8, context_tokens=128, prefill_tokens=32, decode_batches=(1, 4),
                        prefill_chunks=prefill_chunks, token_logprobs=False)
    prepare_core(checkpoint, root / "model.core", key, PrepareOptions(namespace, capacities=plan))
    return checkpoint


def runtime_of(hybrid, **options):
    root, _ = hybrid
    core = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    load = LoadOptions(startup=StartupOptions(max_concurrency=options.pop("concurrency", None)),
                       num_pages=options.pop("num_pages", None), device=options.pop("device", "cpu"))
    return build_runtime(core, RuntimeOptions(load=load, **options))


def reference_tokens(hybrid, prompt: list[int]) -> list[int]:
    _, model = hybrid
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=STEPS, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


PROMPTS = [PREFIX[:13], PREFIX + [50, 51, 52], [7, 8, 9], PREFIX[:5]]


@pytest.fixture(scope="module")
def expected(hybrid):
    return expected_tokens(hybrid)


@functools.cache
def expected_tokens(hybrid) -> list[list[int]]:
    """transformers' greedy tokens of PROMPTS, computed once per session (read only)."""
    return [reference_tokens(hybrid, p) for p in PROMPTS]


def test_contract_declares_recurrent_state_rows(hybrid):
    runtime = runtime_of(hybrid)
    prepared = runtime.engine.executor.model.prepared
    regions = {r.name: r for r in prepared.contract.model.cache.regions}
    assert regions["recurrent"].kind == spb.HISTORY_KIND_RECURRENT
    assert list(regions["recurrent"].planes) == ["conv_state", "ssm_state"]
    assert prepared.contract.snapshot_capacity > 0
    _, state = runtime.engine.executor.storage.planes(StorageKind.STATE)
    assert [p.tensor.shape[1] for p in state] == [4, 4]  # one state row per request slot


def test_greedy_tokens_equal_transformers_alone_and_batched(hybrid, expected):
    alone = runtime_of(hybrid, concurrency=1)
    for prompt, tokens in zip(PROMPTS, expected):
        assert list(generate(alone.engine, [prompt], STEPS)[0].token_ids) == tokens
    batched = runtime_of(hybrid)
    assert [list(r.token_ids) for r in generate(batched.engine, PROMPTS, STEPS)] == expected


def test_shared_prefix_restores_a_snapshot_with_the_same_tokens(hybrid, expected):
    runtime = runtime_of(hybrid)
    generate(runtime.engine, [PROMPTS[0]], STEPS)  # publishes a snapshot at its prompt boundary
    counters = runtime.engine.scheduler.counters()
    assert counters.snapshots_published > 0
    warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
    assert list(warm.token_ids) == expected[1]
    counters = runtime.engine.scheduler.counters()
    assert counters.snapshots_restored == 1 and counters.prefix_reused_tokens >= len(PROMPTS[0])
    assert runtime.engine.stats.snapshot().snapshots_restored == 1  # what /metrics reports


def test_preemption_with_state_offload_gives_the_same_tokens(hybrid, expected):
    runtime = runtime_of(hybrid, num_pages=17, host_pages=32,
                         policy=SchedulerPolicy(preemption=PreemptionMode.OFFLOAD))
    results = generate(runtime.engine, PROMPTS, STEPS)
    assert runtime.engine.scheduler.counters().preemptions > 0
    assert [list(r.token_ids) for r in results] == expected
    _, host_state = runtime.engine.executor.storage.planes(StorageKind.HOST)
    assert any(p.tensor.abs().sum() > 0 for p in host_state)  # state rows went to host slots and back
    runtime.engine.scheduler.check_invariants()
