"""The decoder switches the newer Llama-shaped families added, prepared into signed cores and served
through the runtime on the C++ kernels, against transformers in float32: SmolLM3 (NoPE layers, a
sliding NoPE layer) and, with HELIOS_FAMILY_SERVED_SWEEP=1, Hunyuan dense (q/k norms after the rotation,
NTK-alpha rope; test_hunyuan_moe_recipe serves them by default). Two batched
prompts (one past the 32-token prefill capacity: chunked) and a continuation of the longer one
served from the prefix cache give the reference's greedy tokens and logits. (Ernie 4.5 is served
by tests/parallel/test_config_fuzz_ranks' suite seed; Granite's and Seed-OSS's programs use no
switch of their own beyond Gemma 3's, which tests/ignition/test_gemma3_served serves.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helios.core.keys import SigningKey, write_key_pair
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime
from support.runtime_runs import record_logits
from support.sweeps import in_sweep

from .hf_checkpoints import HUNYUAN, SMOLLM3, Family, random_model, write_checkpoint
from .test_config_fuzz_served import write_frontend_files
from .test_equivalence import TOLERANCE, relative_error

NAMESPACE = "test.helios/llama-shaped-served"
PAGE_TOKENS = 8
PROMPT_LENS = (20, 37)
NEW_TOKENS = 6


def _prepared(root, family, mixed: bool = False):
    reference = random_model(family, seed=9)
    checkpoint = write_checkpoint(reference, root / "checkpoint")
    write_frontend_files(checkpoint)
    key = SigningKey.generate()
    public = write_key_pair(root / "publisher.key", key, [NAMESPACE])
    plan = CapacityPlan(page_tokens=PAGE_TOKENS, context_tokens=64, prefill_tokens=32, decode_batches=(2,),
                        mixed=mixed, token_logprobs=False)
    prepare_core(checkpoint, root / "model.core", key,
                 PrepareOptions(NAMESPACE, dtype="float32", capacities=plan, capture_workers=1))
    return reference, open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[public])


def _served(core, prompts):
    """(prompt, tokens, logits by step) of the batched prompts and of a continuation of the last."""
    runtime = build_runtime(core, RuntimeOptions(load=LoadOptions(cpu_kernels=True)))
    try:
        recorded = record_logits(runtime.engine.executor)
        tokens = [list(r.token_ids) for r in generate(runtime.engine, prompts, NEW_TOKENS)]
        runs = [(prompt, got, dict(recorded[f"offline-{i}"])) for i, (prompt, got) in enumerate(zip(prompts, tokens))]
        continuation = prompts[-1] + tokens[-1] + [2, 3]
        before = runtime.engine.scheduler.counters().prefix_reused_tokens
        continued = list(generate(runtime.engine, [continuation], NEW_TOKENS)[0].token_ids)
        assert runtime.engine.scheduler.counters().prefix_reused_tokens - before >= PAGE_TOKENS
        runs.append((continuation, continued, dict(recorded["offline-0"])))
    finally:
        runtime.close()
    return runs


def _reference_greedy(reference, prompt: list[int]):
    tokens, rows = list(prompt), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            rows.append(reference(torch.tensor([tokens])).logits[0, -1])
            tokens.append(int(rows[-1].argmax()))
    return tokens[len(prompt):], rows


def check_served_core(root: Path, family: Family, prompt_lens: tuple[int, ...] = PROMPT_LENS,
                      mixed: bool = False) -> None:
    """Prepares `family`'s random checkpoint (seed 9) into a core under `root`, serves random prompts
    of `prompt_lens` tokens batched and a continuation of the last from the prefix cache, and checks
    the reference's greedy tokens and logits (test_equivalence's tolerance).

    The core has a MIXED program only with `mixed` (a third of the preparation): without it the scheduler
    runs prompt chunks and decode rows in steps of their own, through the PREFILL and DECODE programs, which
    call every kernel a family's switches take. A MIXED program's own path is latent attention's (prompt rows
    attend to the absorbed latent history, as DECODE's one-token rows do; PREFILL up-projects): the latent
    families pass `mixed`, and tests/ignition/test_config_fuzz_served serves MIXED on every attention shape."""
    check_served(*_prepared(root, family, mixed), prompt_lens)


def check_served(reference, core, prompt_lens: tuple[int, ...] = PROMPT_LENS) -> None:
    """`check_served_core`'s run and checks on a prepared `core` of `reference` (from `_prepared`)."""
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, reference.config.vocab_size, (n,), generator=generator).tolist() for n in prompt_lens]
    for prompt, generated, logits in _served(core, prompts):
        expected, rows = _reference_greedy(reference, prompt)
        assert generated == expected, f"prompt of {len(prompt)} tokens"
        worst = max(relative_error(logits[k], rows[k]) for k in range(NEW_TOKENS))
        assert worst < TOLERANCE, f"prompt of {len(prompt)} tokens: logits differ by {worst:.2e}"


# Hunyuan dense with HELIOS_FAMILY_SERVED_SWEEP=1: by default test_hunyuan_moe_recipe serves its attention
# (the same heads, biases, q/k norms after the rotation and NTK-alpha rope) under a mixture.
@pytest.mark.parametrize("family", in_sweep("HELIOS_FAMILY_SERVED_SWEEP", (SMOLLM3,), (HUNYUAN,)),
                         ids=lambda family: family.name)
def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path, family):
    check_served_core(tmp_path, family)
