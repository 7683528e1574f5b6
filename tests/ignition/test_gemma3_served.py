"""A Gemma 3 text checkpoint prepared into a signed core and served through the runtime on the C++
kernels, against transformers in float32.

The shape: sliding, full, sliding, full layers (``sliding_window_pattern`` 2) over a window of 6,
a linear-scaled global rope beside the local one, ``query_pre_attn_scalar`` other than head_dim, a
final logit soft cap, tied embeddings. Batched prompts shorter and longer than the window (one past
the prefill capacity: chunked) and a continuation served from the prefix cache give the reference's
greedy tokens and logits; the supported-architecture list holds Gemma3ForCausalLM.
"""

from __future__ import annotations

import torch
import transformers

from helios.core.keys import SigningKey, write_key_pair
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.ignition.recipes import SUPPORTED_ARCHITECTURES
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime
from support.runtime_runs import record_logits

from .hf_checkpoints import Family, random_model, write_checkpoint
from .test_config_fuzz_served import write_frontend_files
from .test_equivalence import TOLERANCE, relative_error

NAMESPACE = "test.helios/gemma3-served"
PAGE_TOKENS = 8
GEMMA3_SHAPED = Family("gemma3-served", transformers.Gemma3TextConfig, (
    ("num_hidden_layers", 4), ("head_dim", 16), ("sliding_window", 6), ("sliding_window_pattern", 2),
    ("query_pre_attn_scalar", 20), ("final_logit_softcapping", 50.0), ("tie_word_embeddings", True),
    ("rope_parameters", {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
))
PROMPT_LENS = (4, 20, 37)  # within the window; past it; past the 32-token prefill capacity (chunked)
NEW_TOKENS = 6


def _reference_greedy(reference, prompt: list[int], new_tokens: int):
    tokens, rows = list(prompt), []
    with torch.no_grad():
        for _ in range(new_tokens):
            rows.append(reference(torch.tensor([tokens])).logits[0, -1])
            tokens.append(int(rows[-1].argmax()))
    return tokens[len(prompt):], rows


def test_a_served_gemma3_core_gives_the_reference_tokens(tmp_path):
    assert "Gemma3ForCausalLM" in SUPPORTED_ARCHITECTURES
    reference = random_model(GEMMA3_SHAPED, seed=9)
    checkpoint = write_checkpoint(reference, tmp_path / "checkpoint")
    write_frontend_files(checkpoint)
    key = SigningKey.generate()
    public = write_key_pair(tmp_path / "publisher.key", key, [NAMESPACE])
    plan = CapacityPlan(page_tokens=PAGE_TOKENS, context_tokens=64, prefill_tokens=32, decode_batches=(2,),
                        token_logprobs=False)
    prepare_core(checkpoint, tmp_path / "model.core", key,
                 PrepareOptions(NAMESPACE, dtype="float32", capacities=plan, capture_workers=1))
    core = open_core(tmp_path / "model.core", accept=NAMESPACE, trusted_keys=[public])
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, reference.config.vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENS]
    runtime = build_runtime(core, RuntimeOptions(load=LoadOptions(cpu_kernels=True)))
    try:
        recorded = record_logits(runtime.engine.executor)
        tokens = [list(r.token_ids) for r in generate(runtime.engine, prompts, NEW_TOKENS)]
        runs = [(prompt, generated, dict(recorded[f"offline-{i}"]))
                for i, (prompt, generated) in enumerate(zip(prompts, tokens))]
        continuation = prompts[-1] + tokens[-1] + [2, 3]
        before = runtime.engine.scheduler.counters().prefix_reused_tokens
        continued = list(generate(runtime.engine, [continuation], NEW_TOKENS)[0].token_ids)
        assert runtime.engine.scheduler.counters().prefix_reused_tokens - before >= PAGE_TOKENS
        runs.append((continuation, continued, dict(recorded["offline-0"])))
    finally:
        runtime.close()
    for prompt, generated, logits in runs:
        expected, rows = _reference_greedy(reference, prompt, NEW_TOKENS)
        assert generated == expected, f"prompt of {len(prompt)} tokens"
        worst = max(relative_error(logits[k], rows[k]) for k in range(NEW_TOKENS))
        assert worst < TOLERANCE, f"prompt of {len(prompt)} tokens: logits differ by {worst:.2e}"
