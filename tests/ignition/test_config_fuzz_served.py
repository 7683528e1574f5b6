"""Drawn configuration variants served the way a deployment serves them.

tests/ignition/test_config_fuzz.py compares each drawn checkpoint variant with transformers through
eager programs (the test driver). Serving goes another way: `prepare_core` captures the programs
into a signed core, `open_core` + `build_runtime` load it, and on the CPU every program runs
through the C++ kernels (required here, `cpu_kernels=True`: the default wherever a compiler is
installed). This file prepares a fixed set of those variants (float32, so the reference comparison
is exact up to rounding) whose shapes are where a kernel or the capture may part from the eager
bodies: head_dim 8, 12, 16, 24 (not all multiples of 16), one key/value head, eight query heads per
key/value head, odd vocabularies (97, 131), sliding windows of 6 and 7 (not multiples of the
8-token page), partial rotary (0.25, 0.5), biases, latent attention with and without a query rank,
gpt-oss sinks and windows, Bamba's hybrid state. For each, three prompts batched together (shorter
than a page, longer than a page, longer than the 32-token prefill capacity) and a continuation of
the longest one that the prefix cache serves must give transformers' greedy tokens, and the logits
behind them within `TOLERANCE`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from helios.core.keys import SigningKey, write_key_pair
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime
from support.runtime_runs import record_logits
from support.sweeps import in_sweep

from .test_config_fuzz import DRAWS, _materialize
from .test_equivalence import TOLERANCE, relative_error

NAMESPACE = "test.helios/served-fuzz"
PAGE_TOKENS = 8
PREFILL_TOKENS = 32
# No smaller prefill chunk programs (a third of the preparation): a short prompt or a cached prompt's rest runs
# the 32-token programs, on the same kernels; test_long_positions' served core keeps a chunk program.
PLAN = CapacityPlan(page_tokens=PAGE_TOKENS, context_tokens=128, prefill_tokens=PREFILL_TOKENS,
                    decode_batches=(4,), token_logprobs=False)
PROMPT_LENS = (3, 13, 45)  # within a page; past one page; past the prefill capacity (chunked)
NEW_TOKENS = 6

# (draw, seed): each seed's variant, and the shape axes it covers. The swept ones (HELIOS_SERVED_FUZZ_SWEEP)
# are more variants on the default ones' kernels: a window not a multiple of the page (moe-0's 6), head_dim
# 8 (gpt_oss-1), partial rotary (bamba-1's 0.25), latent attention (deepseek-4) serve by default. dense-4's
# axes serve by default on the others: its dense decoder with head_dim 24 and one key/value head is bamba-1's
# attention layer and MLP, an odd vocabulary moe-0's 97 (and gpt_oss-1's and bamba-1's 131), a rope scaled by
# position alone (llama3's tables) moe-0's linear and the yarn ones, tied embeddings deepseek-4's.
SERVED = in_sweep("HELIOS_SERVED_FUZZ_SWEEP", (
    ("moe", 0),       # Mixtral, head_dim 12, window 6, vocab 97, linear rope
    ("deepseek", 4),  # DeepSeek-V3 with a query rank, two expert groups, yarn, tied
    ("gpt_oss", 1),   # gpt-oss, head_dim 8, one key/value head, window 6 on alternate layers, yarn
    ("bamba", 1),     # Bamba, attention head_dim 24 with partial rotary 0.25, one key/value head, two SSM groups
), (
    ("dense", 4),     # Mistral, head_dim 24, one key/value head, vocab 131, llama3 rope, tied
    ("dense", 12),    # Qwen3, head_dim 24, window 7 on every layer, q/k norm, bias, tied
    ("moe", 5),       # GLM-4 MoE, 8 query heads per key/value head, head_dim 8, partial rotary 0.5
    ("deepseek", 2),  # DeepSeek-V3 latent attention without a query rank, v_head_dim 24
))


def write_frontend_files(directory: Path) -> None:
    """A word-level tokenizer within the smallest drawn vocabulary and a plain chat template (the
    prompts here are token ids: prepare needs the files, not their contents)."""
    vocab = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(16)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    template = ("{% for m in messages %}{{ m.role }} {{ m.content }} <eos> {% endfor %}"
                "{% if add_generation_prompt %}assistant {% endif %}")
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<eos>"}))


def prepare_served(kind: str, seed: int, root: Path):
    """(transformers reference, opened core) of the drawn variant, prepared in float32."""
    reference, checkpoint = _materialize(DRAWS[kind](seed), root / "checkpoint")
    write_frontend_files(checkpoint)
    key = SigningKey.generate()
    public = write_key_pair(root / "publisher.key", key, [NAMESPACE])
    options = PrepareOptions(NAMESPACE, dtype="float32", capacities=PLAN, capture_workers=1)
    prepare_core(checkpoint, root / "model.core", key, options)
    return reference, open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[public])


def reference_greedy(reference, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and their logits, each step a full forward (Bamba's cached step skips
    ``time_step_limit``, which its full forward and Helios apply: see test_config_fuzz)."""
    tokens, rows = list(prompt), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            rows.append(reference(torch.tensor([tokens])).logits[0, -1])
            tokens.append(int(rows[-1].argmax()))
    return tokens[len(prompt):], rows


def served_greedy(core, prompts: list[list[int]]):
    """Greedy tokens of the batched `prompts`, their logits (request index -> output index -> row),
    then those of the longest prompt's continuation, and the prefix tokens the continuation reused."""
    runtime = build_runtime(core, RuntimeOptions(load=LoadOptions(cpu_kernels=True)))
    try:
        recorded = record_logits(runtime.engine.executor)
        tokens = [list(r.token_ids) for r in generate(runtime.engine, prompts, NEW_TOKENS)]
        logits = [dict(recorded[f"offline-{i}"]) for i in range(len(prompts))]
        longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
        continuation = prompts[longest] + tokens[longest] + [2, 3]
        before = runtime.engine.scheduler.counters().prefix_reused_tokens
        continued = list(generate(runtime.engine, [continuation], NEW_TOKENS)[0].token_ids)
        reused = runtime.engine.scheduler.counters().prefix_reused_tokens - before
    finally:
        runtime.close()
    return tokens, logits, continuation, continued, reused


@pytest.fixture(scope="module", params=SERVED, ids=[f"{kind}-{seed}" for kind, seed in SERVED])
def served(request, tmp_path_factory):
    kind, seed = request.param
    reference, core = prepare_served(kind, seed, tmp_path_factory.mktemp(f"served-{kind}-{seed}"))
    vocab = reference.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENS]
    return reference, prompts, served_greedy(core, prompts)


def test_batched_prompts_give_the_reference_greedy_tokens_and_logits(served):
    reference, prompts, (tokens, logits, _, _, _) = served
    for index, prompt in enumerate(prompts):
        expected, rows = reference_greedy(reference, prompt)
        assert tokens[index] == expected, f"prompt of {len(prompt)} tokens"
        worst = max(relative_error(logits[index][k], rows[k]) for k in range(NEW_TOKENS))
        assert worst < TOLERANCE, f"prompt of {len(prompt)} tokens: logits differ by {worst:.2e}"


def test_a_continuation_served_from_the_prefix_cache_gives_the_reference_tokens(served):
    reference, prompts, (tokens, _, continuation, continued, reused) = served
    assert reused >= max(PROMPT_LENS) // PAGE_TOKENS * PAGE_TOKENS  # the longest prompt's full pages at least
    assert continued == reference_greedy(reference, continuation)[0]
