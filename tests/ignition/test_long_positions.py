"""Long positions against transformers: rope scaling regimes past the original context, windows
passed many times over, chunk and page edges inside a window.

tests/ignition/test_config_fuzz.py compares drawn checkpoints with transformers on a 19-token
prompt, shorter than most scaled ropes' original context. Here every checkpoint's
``original_max_position_embeddings`` is 32 (or its windows 5-8 tokens) and the sequences reach
several times that: a prompt shorter than the original context that generates past it (the
threshold crossed in decode), a prompt of about five times it prefilled in chunks whose edges fall
inside a window and off or on a page edge, and a continuation served from the first sequence's
cached pages (a prefix hit) that starts past it. Each must give transformers' float32 greedy tokens
and the logits behind them within `TOLERANCE` (eager programs through the test driver, and for one
variant, two with HELIOS_LONG_POSITION_SWEEP=1, the served core on the C++ kernels). Rope types whose
frequencies depend on the current sequence length ("dynamic" NTK, and "longrope", which switches from
short to long factors once ``max(position_ids) + 1`` passes ``original_max_position_embeddings``) are
refused by every recipe with a typed `CheckpointError` naming the type, but Phi-3's, which fixes the
LongRoPE list by the served context (tests/ignition/test_phi3_recipe.py).

``HELIOS_LONG_POSITION_SEEDS`` (default 1; 2 with HELIOS_LONG_POSITION_SWEEP=1) sets how many of test_config_fuzz's draws per family
also run at long positions with drawn prompt lengths and chunk sizes.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
import transformers

from helios.ignition.architecture import CheckpointError
from helios.ignition.recipes import load_checkpoint
from support.sweeps import in_sweep, swept

from .driver import PagedModel, Sequence, generate
from .test_config_fuzz import (_DEEPSEEK, _GLM, _TINY, DRAWS, PAGE_TOKENS, Variant, _materialize, _programs,
                               _variant)
from .test_equivalence import TOLERANCE, relative_error

ORIGINAL = 32  # every scaled rope's original_max_position_embeddings
SHORT_PROMPT, LONG_PROMPT = 20, 150
CROSSING_TOKENS = 20  # the short prompt's generation: 20 + 20 passes ORIGINAL in decode
LONG_TOKENS = 8
CONTINUATION = (5, 9, 2, 7)  # tokens after the long sequence, served from its cached pages

_LLAMA3 = {"rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL}
_YARN = {"rope_type": "yarn", "rope_theta": 100.0, "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
         "beta_fast": 8.0, "beta_slow": 1.0}
_LONG = dict(_TINY, max_position_embeddings=512)

# name -> (variant, chunk): the long prompt's chunks are `chunk` tokens (chunk edges fall inside
# windows, on a page edge where chunk is a multiple of the driver's 4-token page, off one otherwise).
CASES = {
    "llama-linear": (_variant("llama-linear", transformers.LlamaConfig, dict(
        _LONG, rope_parameters={"rope_type": "linear", "rope_theta": 100.0, "factor": 4.0})), 32),
    # head_dim 16 at theta 100: wavelengths 6.3 to 200 tokens, so the high, medium and low bands all act
    "llama-llama3": (_variant("llama-llama3", transformers.LlamaConfig, dict(
        _LONG, head_dim=16, rope_parameters=_LLAMA3)), 7),
    "llama-yarn-truncate-off": (_variant("llama-yarn", transformers.LlamaConfig, dict(
        _LONG, head_dim=16, rope_parameters={**_YARN, "truncate": False})), 12),
    "qwen2-yarn-mscale-sliding-layers": (_variant("qwen2-yarn", transformers.Qwen2Config, dict(
        _LONG, head_dim=16, use_sliding_window=True, sliding_window=7, max_window_layers=1,
        rope_parameters={**_YARN, "mscale": 0.9, "mscale_all_dim": 0.7})), 5),
    "qwen3-yarn-attention-factor": (_variant("qwen3-yarn", transformers.Qwen3Config, dict(
        _LONG, head_dim=16, rope_parameters={**_YARN, "attention_factor": 1.25})), 16),
    "mistral-window-8": (_variant("mistral-window", transformers.MistralConfig, dict(
        _LONG, sliding_window=8, rope_parameters=_LLAMA3)), 6),
    "glm4_moe-partial-yarn": (_variant("glm4_moe-yarn", transformers.Glm4MoeConfig, dict(
        _GLM, max_position_embeddings=512, rope_parameters={**_YARN, "partial_rotary_factor": 0.5})), 9),
    "deepseek-yarn-mscale": (_variant("deepseek-yarn", transformers.DeepseekV3Config, dict(
        _DEEPSEEK, max_position_embeddings=512, rope_interleave=True,
        rope_parameters={**_YARN, "mscale": 0.707, "mscale_all_dim": 1.0})), 8),
    "gpt_oss-yarn-sinks-window-6": (_variant("gpt_oss-yarn", transformers.GptOssConfig, dict(
        _LONG, head_dim=8, num_local_experts=2, num_experts_per_tok=2, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={**_YARN, "rope_theta": 150000.0, "truncate": False})), 5),
}


def _reference_greedy(reference, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the logits behind each, every step a full forward over the sequence so far."""
    tokens, rows = list(prompt), []
    with torch.no_grad():
        for _ in range(new_tokens):
            rows.append(reference(torch.tensor([tokens])).logits[0, -1])
            tokens.append(int(rows[-1].argmax()))
    return tokens[len(prompt):], torch.stack(rows)


def _assert_matches(reference, sequence: Sequence, prompt: list[int], what: str) -> None:
    expected, logits = _reference_greedy(reference, prompt, len(sequence.generated))
    assert sequence.generated == expected, f"{what}: greedy tokens differ"
    worst = relative_error(torch.stack(sequence.logits), logits)
    assert worst < TOLERANCE, f"{what}: logits differ by {worst:.2e}"


def check_long_positions(variant: Variant, directory: Path, chunk: int, prompt_lens=(SHORT_PROMPT, LONG_PROMPT),
                         seed: int = 0, reread: bool = False) -> str:
    """'refused: <reason>' or 'matches'; raises AssertionError where Helios and transformers differ.
    The first prompt generates CROSSING_TOKENS (in chunks of 8), the second LONG_TOKENS (in chunks
    of `chunk`); a continuation of the second then starts from its cached full pages. `reread`: the
    reference is transformers loading the written checkpoint (its config.json rewrites included)."""
    reference, directory = _materialize(variant, directory)
    if reread:
        reference = transformers.AutoModelForCausalLM.from_pretrained(
            directory, attn_implementation="eager", dtype=torch.float32).eval()
    try:
        recipe = load_checkpoint(directory)
    except CheckpointError as error:
        named = [field for field in variant.fields if field in str(error)]
        assert named, f"refusal names none of the drawn settings {sorted(variant.fields)}: {error}"
        return f"refused: {error}"
    generator = torch.Generator().manual_seed(seed)
    short, long = (torch.randint(0, recipe.architecture.vocab_size, (n,), generator=generator).tolist()
                   for n in prompt_lens)
    model = PagedModel(recipe.weight_tensors, _programs(recipe.architecture), num_pages=192, max_pages=64)
    crossing = Sequence(0, list(short))
    generate(model, [crossing], CROSSING_TOKENS, chunk=8)
    _assert_matches(reference, crossing, short, f"prompt of {len(short)} generating past {ORIGINAL}")
    first = Sequence(1, list(long))
    generate(model, [first], LONG_TOKENS, chunk=chunk)
    _assert_matches(reference, first, long, f"prompt of {len(long)} in chunks of {chunk}")
    continuation = first.token_ids + [t % recipe.architecture.vocab_size for t in CONTINUATION]
    if recipe.architecture.recurrent is None:  # a new slot sharing the first's full pages (a prefix hit)
        cached = first.num_cached // PAGE_TOKENS
        second = Sequence(2, list(continuation), pages=first.pages[:cached], window_pages=first.window_pages[:cached],
                          num_cached=cached * PAGE_TOKENS)
    else:  # the mixer state lives in the first's slot, at its cached length
        second = Sequence(1, list(continuation), pages=first.pages, num_cached=first.num_cached)
    start = second.num_cached
    generate(model, [second], LONG_TOKENS, chunk=chunk)
    _assert_matches(reference, second, continuation, f"continuation from position {start}")
    return "matches"


@pytest.mark.parametrize("name", sorted(CASES))
def test_long_positions_match_the_reference(tmp_path, name):
    variant, chunk = CASES[name]
    assert check_long_positions(variant, tmp_path, chunk) == "matches"


# The pretraining context as older checkpoints spell it: Phi-3's top-level
# original_max_position_embeddings (16) before the rope dict's (64), which transformers reads first;
# none at all, where llama3 takes max_position_embeddings (40, passed by the long prompt too).
_TOP_LEVEL_CONTEXT = {"rope_parameters": None, "rope_theta": 100.0, "original_max_position_embeddings": 16,
                      "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}
REREAD_CASES = {
    "mixtral-yarn-top-level-context": _variant("mixtral-yarn", transformers.MixtralConfig, dict(
        _LONG, head_dim=8, num_local_experts=4, num_experts_per_tok=2, rope_parameters=_YARN), _TOP_LEVEL_CONTEXT),
    "deepseek-yarn-top-level-context": _variant("deepseek-yarn", transformers.DeepseekV3Config, dict(
        _DEEPSEEK, max_position_embeddings=512, rope_parameters=_YARN), {**_TOP_LEVEL_CONTEXT, "rope_scaling": {
            **_TOP_LEVEL_CONTEXT["rope_scaling"], "mscale": 1.0, "mscale_all_dim": 0.8}}),
    "gpt_oss-yarn-top-level-context": _variant("gpt_oss-yarn", transformers.GptOssConfig, dict(
        _LONG, head_dim=8, num_local_experts=2, num_experts_per_tok=2, sliding_window=6, rope_parameters=_YARN),
        _TOP_LEVEL_CONTEXT),
    "qwen2-llama3-without-context": _variant("qwen2-llama3", transformers.Qwen2Config, dict(
        _LONG, head_dim=16, rope_parameters=_LLAMA3), {
            "rope_parameters": None, "rope_theta": 100.0, "max_position_embeddings": 40,
            "rope_scaling": {key: value for key, value in _LLAMA3.items() if key != "original_max_position_embeddings"}}),
}


@pytest.mark.parametrize("name", sorted(REREAD_CASES))
def test_long_positions_match_the_reference_reading_the_same_config(tmp_path, name):
    assert check_long_positions(REREAD_CASES[name], tmp_path, chunk=7, reread=True) == "matches"


# test_config_fuzz's draws (rope types with original contexts 16 and 64, windows 4-8, sinks) at long
# positions: a drawn long prompt (64-200 tokens) and chunk size (3-32) per seed. One seed a family by default,
# two with HELIOS_LONG_POSITION_SWEEP=1: more draws on the same paths (every family's long-position path runs
# with the first seed, and the named CASES above pin each rope type and window).
SWEEP_SEEDS = int(os.environ.get("HELIOS_LONG_POSITION_SEEDS", "2" if swept("HELIOS_LONG_POSITION_SWEEP") else "1"))
SWEEP_KINDS = ("dense", "moe", "deepseek", "gpt_oss", "bamba")


@pytest.mark.parametrize("kind, seed", [(kind, seed) for kind in SWEEP_KINDS for seed in range(SWEEP_SEEDS)],
                         ids=lambda value: str(value))
def test_a_drawn_configuration_at_long_positions_matches_or_is_refused_by_name(tmp_path, kind, seed):
    rng = random.Random(f"long-{kind}-{seed}")
    prompt_lens = (rng.randrange(8, 40), rng.randrange(64, 200))
    check_long_positions(DRAWS[kind](seed), tmp_path, rng.randrange(3, 33), prompt_lens, seed)


# ---------------------------------------------------------------------------------------------------
# Served: the captured core on the C++ kernels, its scheduler's chunks, window region and prefix cache.

SERVED_PLAN_PAGE_TOKENS = 8
# 20-token prefill chunks: their edges fall inside every window, off a page edge (20, 60, ...) and on one (40, 80)
SERVED_PLAN = dict(page_tokens=SERVED_PLAN_PAGE_TOKENS, context_tokens=256, prefill_tokens=20, decode_batches=(4,),
                   prefill_chunks=(8,), token_logprobs=False)
# Qwen2's variant served with HELIOS_LONG_POSITION_SWEEP=1: GPT-OSS's core serves the same path by default (a
# yarn rope with its attention factor, a sliding layer then a full one past their window); Qwen2's mscale rule is
# the prepared rope table, which test_long_positions_match_the_reference[qwen2-yarn-mscale-sliding-layers] checks.
SERVED = in_sweep("HELIOS_LONG_POSITION_SWEEP", ("gpt_oss-yarn-sinks-window-6",), ("qwen2-yarn-mscale-sliding-layers",))


def prepare_long_served(variant: Variant, root: Path):
    """(transformers reference, opened core) of `variant`, prepared in float32 for long sequences."""
    from helios.core.keys import SigningKey, write_key_pair
    from helios.core.reader import open_core
    from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core

    from .test_config_fuzz_served import NAMESPACE, write_frontend_files

    reference, checkpoint = _materialize(variant, root / "checkpoint")
    write_frontend_files(checkpoint)
    key = SigningKey.generate()
    public = write_key_pair(root / "publisher.key", key, [NAMESPACE])
    options = PrepareOptions(NAMESPACE, dtype="float32", capacities=CapacityPlan(**SERVED_PLAN), capture_workers=1)
    prepare_core(checkpoint, root / "model.core", key, options)
    return reference, open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[public])


def served_long(core, prompts: list[list[int]], limits: list[int], continuation_tail: list[int]):
    """Greedy tokens and logits of the batched `prompts`, then a continuation of the last one (its
    tokens, logits and the prefix tokens it reused)."""
    from helios.runtime.loading.model import LoadOptions
    from helios.runtime.offline import generate as served_generate
    from helios.runtime.service import RuntimeOptions, build_runtime

    from support.runtime_runs import record_logits

    runtime = build_runtime(core, RuntimeOptions(load=LoadOptions(cpu_kernels=True)))
    try:
        runtime.engine.frames = 1  # each plan's logits read before the next launch reuses their buffer
        recorded = record_logits(runtime.engine.executor)
        tokens = [list(r.token_ids) for r in served_generate(runtime.engine, prompts, limits)]
        logits = [dict(recorded.pop(f"offline-{i}")) for i in range(len(prompts))]  # the continuation reuses ids
        continuation = prompts[-1] + tokens[-1] + continuation_tail
        before = runtime.engine.scheduler.counters().prefix_reused_tokens
        continued = list(served_generate(runtime.engine, [continuation], LONG_TOKENS)[0].token_ids)
        reused = runtime.engine.scheduler.counters().prefix_reused_tokens - before
        continued_logits = recorded["offline-0"]
    finally:
        runtime.close()
    return tokens, logits, continuation, (continued, continued_logits), reused


@pytest.fixture(scope="module", params=SERVED)
def served(request, tmp_path_factory):
    variant, _ = CASES[request.param]
    reference, core = prepare_long_served(variant, tmp_path_factory.mktemp(f"long-{request.param}"))
    generator = torch.Generator().manual_seed(3)
    vocab = reference.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (SHORT_PROMPT, LONG_PROMPT)]
    return reference, prompts, served_long(core, prompts, [CROSSING_TOKENS, LONG_TOKENS], list(CONTINUATION))


def test_served_long_positions_match_the_reference(served):
    reference, prompts, (tokens, logits, continuation, (continued, continued_logits), reused) = served
    runs = [*zip(prompts, tokens, logits), (continuation, continued, continued_logits)]
    for prompt, generated, rows in runs:
        expected, expected_rows = _reference_greedy(reference, prompt, len(generated))
        assert generated == expected, f"sequence of {len(prompt)} tokens: greedy tokens differ"
        worst = max(relative_error(rows[k], expected_rows[k]) for k in range(len(expected)))
        assert worst < TOLERANCE, f"sequence of {len(prompt)} tokens: logits differ by {worst:.2e}"
    assert reused >= LONG_PROMPT // SERVED_PLAN_PAGE_TOKENS * SERVED_PLAN_PAGE_TOKENS, "no prefix hit"


# ---------------------------------------------------------------------------------------------------
# Rope types whose frequencies follow the current sequence length: refused by every recipe, by name.
# (transformers recomputes "dynamic" NTK's base once max(position_ids) + 1 passes
# max_position_embeddings, and switches "longrope" from short to long factors once it passes
# original_max_position_embeddings, each forward: a cached key keeps the rotation of the forward
# that wrote it, so no paged cache can give both its full and its cached forward.)

_HALF_ROTARY = 8  # head_dim 16 of hf_checkpoints' families, halved
_LENGTH_DEPENDENT = {
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * _HALF_ROTARY,
                 "long_factor": [2.0] * _HALF_ROTARY, "original_max_position_embeddings": ORIGINAL},
}


def _refusal_families():
    from . import hf_checkpoints as hf

    return (hf.LLAMA2, hf.MISTRAL, hf.QWEN2, hf.QWEN3, hf.MIXTRAL, hf.QWEN3_MOE, hf.GLM4_MOE, hf.DEEPSEEK_DENSE,
            hf.GPT_OSS, hf.BAMBA_ONE_GROUP)


@pytest.mark.parametrize("family", _refusal_families(), ids=lambda family: family.name)
@pytest.mark.parametrize("rope_type", sorted(_LENGTH_DEPENDENT))
def test_a_length_dependent_rope_is_refused_by_name(tmp_path, family, rope_type):
    rope = _LENGTH_DEPENDENT[rope_type]
    legacy = {k: v for k, v in rope.items() if k != "rope_type"}
    for layout, rewrite in (("current", {"rope_parameters": rope, "rope_scaling": None}),
                            ("legacy", {"rope_parameters": None, "rope_theta": 10000.0,
                                        "rope_scaling": {"type": rope_type, **legacy}})):
        variant = Variant(family, tuple(rewrite.items()))
        outcome = check_long_positions(variant, tmp_path / layout, chunk=8)
        assert outcome.startswith("refused") and f"rope_type {rope_type!r}" in outcome, (layout, outcome)


@pytest.mark.parametrize("rope_type", sorted(_LENGTH_DEPENDENT))
def test_a_vision_language_checkpoint_with_a_length_dependent_rope_is_refused_by_name(rope_type):
    from helios.ignition.recipes import qwen_vl

    class NoTensors:
        names = frozenset()

        def __contains__(self, name):
            return False

    text = dict(_TINY, rope_scaling={**_LENGTH_DEPENDENT[rope_type], "mrope_section": [2, 3, 3]})
    with pytest.raises(CheckpointError, match=f"rope_type '{rope_type}'"):
        qwen_vl.build("Qwen2_5_VLForConditionalGeneration", {"text_config": text}, NoTensors(), "float32")
