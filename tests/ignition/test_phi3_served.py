"""A Phi-4-mini-shaped checkpoint (partial rotary 0.75, LongRoPE, a sliding window) prepared into a
signed core and served through the runtime on the C++ kernels, against transformers in float32.

Served context past ``original_max_position_embeddings``: preparation says that the long factors
are taken (a notice line); prompts longer than the original context, batched, and a continuation
served from the prefix cache give the reference's greedy tokens and logits. Served context within
it: no notice, and every sequence the core admits gives the reference's (short-factor) tokens.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.core.keys import SigningKey, write_key_pair
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime
from support.runtime_runs import record_logits

from .hf_checkpoints import Family, random_model, write_checkpoint
from .test_config_fuzz_served import write_frontend_files
from .test_equivalence import TOLERANCE, relative_error

NAMESPACE = "test.helios/phi3-served"
ORIGINAL = 16
PAGE_TOKENS = 8
PHI4_SHAPED = Family("phi4-served", transformers.Phi3Config, (
    ("partial_rotary_factor", 0.75), ("original_max_position_embeddings", ORIGINAL), ("sliding_window", 7),
    ("tie_word_embeddings", False), ("pad_token_id", None), ("bos_token_id", None), ("eos_token_id", None),
    ("rope_parameters", {"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": [1.0 + 0.05 * i for i in range(6)],
                         "long_factor": [1.0 + 1.7 * i for i in range(6)]}),
))
# (context_tokens, prompt lengths, new tokens): past the original context, prompts longer than it
# (one past the 32-token prefill capacity: chunked); within it, every position below it.
LONG = (64, (20, 37), 6)
SHORT = (ORIGINAL, (3, 9), 6)


def _prepared(root, context_tokens: int):
    reference = random_model(PHI4_SHAPED, seed=9)
    checkpoint = write_checkpoint(reference, root / "checkpoint")
    write_frontend_files(checkpoint)
    key = SigningKey.generate()
    public = write_key_pair(root / "publisher.key", key, [NAMESPACE])
    plan = CapacityPlan(page_tokens=PAGE_TOKENS, context_tokens=context_tokens, prefill_tokens=min(32, context_tokens),
                        decode_batches=(2,), token_logprobs=False)
    lines: list[str] = []
    prepare_core(checkpoint, root / "model.core", key,
                 PrepareOptions(NAMESPACE, dtype="float32", capacities=plan, capture_workers=1), progress=lines.append)
    return reference, open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[public]), lines


def _served(core, prompts, new_tokens: int, continue_longest: bool):
    runtime = build_runtime(core, RuntimeOptions(load=LoadOptions(cpu_kernels=True)))
    try:
        recorded = record_logits(runtime.engine.executor)
        tokens = [list(r.token_ids) for r in generate(runtime.engine, prompts, new_tokens)]
        logits = [dict(recorded[f"offline-{i}"]) for i in range(len(prompts))]
        runs = list(zip(prompts, tokens, logits))
        if continue_longest:
            continuation = prompts[-1] + tokens[-1] + [2, 3]
            before = runtime.engine.scheduler.counters().prefix_reused_tokens
            continued = list(generate(runtime.engine, [continuation], new_tokens)[0].token_ids)
            assert runtime.engine.scheduler.counters().prefix_reused_tokens - before >= PAGE_TOKENS
            runs.append((continuation, continued, dict(recorded["offline-0"])))
    finally:
        runtime.close()
    return runs


def _reference_greedy(reference, prompt: list[int], new_tokens: int):
    tokens, rows = list(prompt), []
    with torch.no_grad():
        for _ in range(new_tokens):
            rows.append(reference(torch.tensor([tokens])).logits[0, -1])
            tokens.append(int(rows[-1].argmax()))
    return tokens[len(prompt):], rows


@pytest.mark.parametrize("served", [LONG, SHORT], ids=["past-original-context", "within-original-context"])
def test_a_served_phi3_core_gives_the_reference_tokens_and_says_which_factors(tmp_path, served):
    context, lengths, new_tokens = served
    reference, core, lines = _prepared(tmp_path, context)
    notices = [line for line in lines if line.startswith("notice: LongRoPE")]
    assert len(notices) == (context > ORIGINAL)
    generator = torch.Generator().manual_seed(context)
    prompts = [torch.randint(0, reference.config.vocab_size, (n,), generator=generator).tolist() for n in lengths]
    for prompt, generated, logits in _served(core, prompts, new_tokens, continue_longest=context > ORIGINAL):
        expected, rows = _reference_greedy(reference, prompt, new_tokens)
        assert generated == expected, f"prompt of {len(prompt)} tokens"
        worst = max(relative_error(logits[k], rows[k]) for k in range(new_tokens))
        assert worst < TOLERANCE, f"prompt of {len(prompt)} tokens: logits differ by {worst:.2e}"
