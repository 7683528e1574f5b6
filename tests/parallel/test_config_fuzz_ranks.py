"""Tensor-parallel ranks over drawn checkpoint configurations, against transformers.

tests/ignition/test_config_fuzz.py draws tiny checkpoint variants of every family; this file takes
those draws and redraws, for each rank count, the shapes a tensor-parallel cut meets (`draw_cut`:
query heads, key/value heads, MLP and expert widths and mixer heads as the rank count times 1, 2
or 3 (an odd share per rank) or, in a few draws, a count it does not divide (key/value heads fewer
than the ranks among them); experts fewer than the ranks or not dividing by them (experts are
split by width, not count); shared experts; latent attention; mixer groups split, one, or
indivisible; vocabularies of 97, 131, 250, 255 (the last shard padded)). Each is prepared for 2
ranks and, every other seed, 4 (`ranks_for`), odd seeds with MIXED programs, then served through
the path tests/parallel/test_families.py takes (`prepare_core`, `open_core`, `build_runtime` with
ranks as threads of this process over gloo). The rule (`helios.ignition.sharding.rank_architecture`):
query heads, key/value heads (fewer than the ranks are refused, not replicated), the MLP width, the
expert and shared-expert widths and a Mamba2 mixer's heads and groups (unless one group) must
divide by the rank count; the vocabulary need not (its last shard is padded). A variant prepared
must give, in float32:

- a batch of three prompts of mixed lengths (within a page, past a page, past the 16-token prefill
  capacity: chunked): transformers' greedy tokens, and each sampled token's log-probability and
  its three best alternatives within `TOLERANCE` of the reference's log-softmax;
- one of them scored (scored prefill, attention families): every prompt token's log-probability;
- a continuation of the longest prompt, served from the prefix cache: the reference's tokens.

A variant the cut makes indivisible must be refused at preparation with a `CheckpointError` that
names a setting of the variant's config.json (as must any single-rank refusal): never a crash, a
hang or a different model; a refusal of the cut names a setting the ranks do not divide. `SEEDS`
is the fixed set the suite runs (``HELIOS_RANK_FUZZ_SWEEP=1`` adds `SWEEP_SEEDS`);
``HELIOS_RANK_FUZZ_SEEDS=N`` (or ``A:B``) runs seeds 0..N-1 (or A..B-1) of every family instead, on
the rank counts `ranks_for` gives: a sweep, outside the suite's time budget.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import zlib
from pathlib import Path

import pytest
import torch

from helios.core.keys import SigningKey, write_key_pair
from helios.core.reader import open_core
from helios.ignition.architecture import CheckpointError
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, PromptScoresEvent, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import RuntimeOptions, build_runtime
from ignition.hf_checkpoints import Family
from ignition.test_config_fuzz import DRAWS, Variant, _materialize
from ignition.test_config_fuzz_served import write_frontend_files
from ignition.test_equivalence import TOLERANCE
from support.sweeps import in_sweep

from .conftest import FAST

NAMESPACE = "test.helios/rank-fuzz"
PAGE_TOKENS = 8
PLAN = dict(page_tokens=PAGE_TOKENS, context_tokens=64, prefill_tokens=16, decode_batches=(4,), token_logprobs=True)
PROMPT_LENS = (3, 13, 21)  # within a page; past one page; past the prefill capacity (chunked)
NEW_TOKENS = 6
TOP = 3  # alternatives asked with every sampled token
HYBRID_MODEL_TYPES = ("bamba", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")  # no scoring program


def _choice(rng: random.Random, options):
    return options[rng.randrange(len(options))]


def _head_dim(config: dict) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def _cut(rng: random.Random, ranks: int, multiples, fits=lambda n: True, uneven: float = 0.15) -> int:
    """A count the ranks divide (`ranks` times one of `multiples`: an odd share where the multiple
    is odd), or with probability `uneven` one below ``ranks * max(multiples)`` that they do not;
    only counts that `fits` accepts (the other kind where none of one kind fits)."""
    divisible = [ranks * m for m in multiples if fits(ranks * m)]
    indivisible = [n for n in range(1, ranks * max(multiples)) if n % ranks and fits(n)]
    if indivisible and (rng.random() < uneven or not divisible):
        return _choice(rng, indivisible)
    return _choice(rng, divisible)


def draw_cut(kind: str, seed: int, ranks: int) -> Variant:
    """`DRAWS[kind](seed)` with its tensor-parallel extents redrawn for `ranks` ranks (from their
    own random stream, so the rest of the draw stays test_config_fuzz's): hidden size, query and
    key/value heads (transformers' Llama needs heads dividing the hidden size), MLP and expert
    widths, expert counts and groups, mixer heads and groups, the vocabulary."""
    base = DRAWS[kind](seed)
    rng = random.Random(f"cut-{kind}-{seed}-{ranks}")
    config = dict(base.family.overrides)
    name = base.family.name.rsplit("-", 1)[0]
    if kind not in ("deepseek", "latent"):
        config["head_dim"] = _head_dim(config)  # the drawn head width, whatever the hidden size and heads
    hidden = config["hidden_size"] = _choice(rng, (48, 64, 96))
    heads = config["num_attention_heads"] = _cut(rng, ranks, (1, 2, 3), lambda n: hidden % n == 0, 0.1)
    if "short_factor" in config.get("rope_parameters", {}):  # Phi3Config sizes LongRoPE's lists by hidden / heads
        config["hidden_size"] = hidden = config["head_dim"] * heads
        # and switches lists as a forward passes the original context: these short prompts' outputs cross
        # any shorter one, where no prepared core (one list) can follow it (tests/ignition/test_phi3_recipe.py)
        config["original_max_position_embeddings"] = config["max_position_embeddings"]
    if kind == "olmoe":  # OlmoeAttention sizes its q/k norms by hidden_size: the head width is hidden / heads
        config["hidden_size"] = hidden = config.pop("head_dim") * heads
    if kind in ("deepseek", "latent") or ("num_key_value_heads", None) in base.legacy:
        # latent attention: a key head per query head; a Llama 1/2 config.json without the count
        config["num_key_value_heads"] = heads
    else:  # fewer key/value heads than ranks, or a count they do not divide: a quarter of the draws
        config["num_key_value_heads"] = _cut(rng, ranks, (1, 2, 3), lambda n: heads % n == 0, 0.25)
    if "intermediate_size" in config:  # gpt-oss: the expert width
        config["intermediate_size"] = _cut(rng, ranks, (3, 4, 5) if kind == "gpt_oss" else (5, 6, 9, 12), uneven=0.1)
    if "moe_intermediate_size" in config:
        config["moe_intermediate_size"] = _cut(rng, ranks, (3, 4, 5), uneven=0.1)
    if config.get("shared_expert_intermediate_size"):  # Qwen2-MoE's gated shared expert
        config["shared_expert_intermediate_size"] = _cut(rng, ranks, (2, 4, 5), uneven=0.1)
    if config.get("shared_intermediate_size"):  # Granite MoE Shared's shared expert
        config["shared_intermediate_size"] = _cut(rng, ranks, (2, 4, 5), uneven=0.1)
    experts_key = next((k for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
                        if k in config), None)
    if experts_key is not None:  # experts are not split: fewer than the ranks, or a count they do not divide
        experts = config[experts_key] = _choice(rng, (2, 3, 4, 6, 8))
        if "n_group" in config:  # groups of two experts at least, the choice within the kept groups
            groups = _choice(rng, [g for g in (1, 2, 4) if experts % g == 0 and experts // g >= 2])
            config.update(n_group=groups, topk_group=_choice(rng, range(1, groups + 1)))
            experts = experts // groups * config["topk_group"]
        if "moe_topk" in config:  # Hunyuan MoE: a number or a per-layer list
            top_k = config["moe_topk"]
            config["moe_topk"] = [min(k, experts) for k in top_k] if isinstance(top_k, list) else min(top_k, experts)
        elif "moe_k" in config:  # Ernie 4.5 MoE
            config["moe_k"] = min(config["moe_k"], experts)
        else:
            config["num_experts_per_tok"] = min(config["num_experts_per_tok"], experts)
    if kind == "bamba":
        inner = hidden * 2  # mamba_expand 2
        mixer_heads = _cut(rng, ranks, (1, 2, 3), lambda n: inner % n == 0 and n > 1, 0.1)
        groups = 1 if rng.random() < 0.4 else _cut(rng, ranks, (1, 2), lambda n: mixer_heads % n == 0, 0.25)
        config.update(mamba_n_heads=mixer_heads, mamba_d_head=inner // mixer_heads, mamba_n_groups=groups)
    if kind == "qwen3_next":  # Gated DeltaNet layers: key heads split, each with the value heads reading it
        key_heads = _cut(rng, ranks, (1, 2), uneven=0.15)
        config.update(linear_num_key_heads=key_heads, linear_num_value_heads=key_heads * (
            config["linear_num_value_heads"] // config["linear_num_key_heads"]))
    config["vocab_size"] = _choice(rng, (97, 128, 131, 250, 255))
    family = Family(f"{name}-cut{ranks}-{seed}", base.family.config_class, tuple(config.items()))
    return dataclasses.replace(base, family=family)


def ranks_for(seed: int) -> tuple[int, ...]:
    """Rank counts a drawn seed runs on (each its own cut): 2, and 4 for every other seed."""
    return (2, 4) if seed % 2 == 0 else (2,)


# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Served:
    tokens: list[list[int]]
    logprobs: list[list]  # per prompt, per output token: TokenLogprobs
    prompt_scores: dict[int, object]  # prompt token index -> TokenLogprobs (the scored prompt)
    continued: list[int]
    reused: int


def prepare_ranks(variant: Variant, ranks: int, root: Path, mixed: bool):
    """(reference, opened core for `ranks` ranks) or (reference, the CheckpointError preparing it);
    `mixed`: with MIXED programs (a step prefilling one prompt decodes the others beside it)."""
    reference, checkpoint = _materialize(variant, root / "checkpoint")
    # transformers' grouped expert matmul needs 16-byte strides (an expert width of 18 float32s has
    # none); its eager loop computes the same experts
    reference.config._experts_implementation = "eager"
    write_frontend_files(checkpoint)
    key = SigningKey.generate()
    public = write_key_pair(root / "publisher.key", key, [NAMESPACE])
    scored = reference.config.model_type not in HYBRID_MODEL_TYPES  # hybrid decoders have no scoring program
    plan = CapacityPlan(**PLAN, mixed=mixed, scored_prefill=scored)
    options = PrepareOptions(NAMESPACE, dtype="float32", capacities=plan, capture_workers=1, tensor_parallel=ranks)
    try:
        prepare_core(checkpoint, root / "model.core", key, options)
    except CheckpointError as error:  # UnsupportedCheckpoint among them
        return reference, error
    return reference, open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[public])


def serve(core, prompts: list[list[int]], scored: bool) -> Served:
    """The batched `prompts` (each asking for `TOP` alternatives, the second scored where `scored`),
    then a continuation of the longest, on the core's ranks (threads)."""
    runtime = build_runtime(core, RuntimeOptions(ranks=FAST))
    try:
        events = {}
        for index, prompt in enumerate(prompts):
            spec = RequestSpec(f"r{index}", tuple(prompt), NEW_TOKENS, top_logprobs=TOP,
                               score_prompt=scored and index == 1)
            events[index] = []
            runtime.engine.submit(EngineRequest(spec, events[index].append))
        runtime.engine.run_until_idle()
        longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
        tokens = [[t for e in events[i] if isinstance(e, TokenEvent) for t in e.token_ids] for i in events]
        continuation = prompts[longest] + tokens[longest] + [2, 3]
        spec = RequestSpec("continued", tuple(continuation), NEW_TOKENS)
        events["continued"] = []
        runtime.engine.submit(EngineRequest(spec, events["continued"].append))
        runtime.engine.run_until_idle()
    finally:
        runtime.close()
    for key, seen in events.items():
        finish = seen[-1]
        assert isinstance(finish, FinishEvent) and finish.reason.name == "LENGTH", (key, finish)
    scores = {e.first_index + k: s for e in events.get(1, ()) if isinstance(e, PromptScoresEvent)
              for k, s in enumerate(e.scores)}
    return Served(tokens, [[s for e in events[i] if isinstance(e, TokenEvent) for s in e.logprobs]
                           for i in range(len(prompts))],
                  scores, [t for e in events["continued"] if isinstance(e, TokenEvent) for t in e.token_ids],
                  events["continued"][-1].num_reused_tokens)


def reference_rows(reference, prompt: list[int]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Greedy tokens, the log-softmax row behind each (every step a full forward: see
    test_config_fuzz's `_reference_greedy`) and the prompt's own log-softmax rows."""
    tokens, rows = list(prompt), []
    with torch.no_grad():
        for step in range(NEW_TOKENS):
            logits = reference(torch.tensor([tokens])).logits[0]
            if step == 0:
                prompt_rows = torch.log_softmax(logits, dim=-1)
            rows.append(torch.log_softmax(logits[-1], dim=-1))
            tokens.append(int(rows[-1].argmax()))
    return tokens[len(prompt):], torch.stack(rows), prompt_rows


def _close(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def check_ranks(variant: Variant, ranks: int, root: Path, mixed: bool = False) -> str:
    """'refused: <reason>' or 'matches'; raises AssertionError where the ranks and transformers differ."""
    reference, core = prepare_ranks(variant, ranks, root, mixed)
    if isinstance(core, CheckpointError):
        named = [field for field in variant.fields if field in str(core)]
        assert named, f"refusal names none of the drawn settings {sorted(variant.fields)}: {core}"
        if f"tensor parallel {ranks}" in str(core):  # the cut's refusal: a setting the ranks do not divide
            config = dict(variant.family.overrides)
            assert any(isinstance(config.get(f), int) and config[f] % ranks for f in named), core
        return f"refused: {core}"
    vocab = reference.config.vocab_size
    generator = torch.Generator().manual_seed(zlib.crc32(variant.family.name.encode()))
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENS]
    scored = reference.config.model_type not in HYBRID_MODEL_TYPES
    served = serve(core, prompts, scored)
    for index, prompt in enumerate(prompts):
        expected, rows, prompt_rows = reference_rows(reference, prompt)
        where = f"{ranks} ranks, prompt of {len(prompt)} tokens"
        assert served.tokens[index] == expected, f"{where}: greedy tokens differ"
        for step, (scores, row) in enumerate(zip(served.logprobs[index], rows, strict=True)):
            assert _close(scores.logprob, float(row[expected[step]])), f"{where}, token {step}: log-probability"
            best = row.topk(TOP).values.tolist()
            assert all(_close(value, want) for (_, value), want in zip(scores.top, best, strict=True)), \
                f"{where}, token {step}: alternatives {scores.top} against {best}"
            assert all(_close(value, float(row[i])) for i, value in scores.top), f"{where}, token {step}"
        if scored and index == 1:
            assert sorted(served.prompt_scores) == list(range(1, len(prompt)))
            for position, score in served.prompt_scores.items():
                want = float(prompt_rows[position - 1][prompt[position]])
                assert _close(score.logprob, want), f"{where}: prompt token {position}'s log-probability"
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    assert served.reused >= len(prompts[longest]) // PAGE_TOKENS * PAGE_TOKENS, "the prefix cache served nothing"
    continuation = prompts[longest] + served.tokens[longest] + [2, 3]
    assert served.continued == reference_rows(reference, continuation)[0], f"{ranks} ranks: continuation differs"
    return "matches"


# ---------------------------------------------------------------------------------------------------
# The suite's seeds (each variant's cut noted), or a sweep of HELIOS_RANK_FUZZ_SEEDS seeds per family.

SEEDS = (  # (draw, seed, ranks): one of each kind of cut
    ("deepseek", 163, 2),  # DeepSeek-V3 (test_families' deepseek case runs only in its sweep): latent attention,
                           # 4 heads (2 a rank) through the low-rank query pair, one dense layer then 8 routed
                           # experts of width 6 (3 a rank) in 2 groups (1 kept), a shared expert, YaRN, vocab 255,
                           # MIXED programs
    ("dense", 17, 2),     # refused: one key/value head for 2 ranks (fewer than the ranks)
    ("bamba", 2, 2),      # refused: 3 mixer groups and an MLP width of 9 for 2 ranks
    ("phi3", 6, 4),       # refused: an MLP width of 29 for 4 ranks
    ("gemma3", 8, 4),     # Gemma 3: 12 heads on 4 ranks (3 each), window 5, q/k/v/o biases, untied, vocab 97
)
# With HELIOS_RANK_FUZZ_SWEEP=1 besides (about 185 s of CPU on a 2-core machine): cuts of families that
# tests/parallel/test_families.py runs on two ranks, and 4-rank cuts of mechanisms the seeds above cut on 4 ranks
# (split heads with their window). The first five were in the suite's seeds: DeepSeek's latent heads in an odd
# share (seed 163 above cuts them in an even one, the gemma3 seed heads in an odd one), Bamba's groups split over
# two ranks as test_families' hybrid snapshot test splits them, Ernie 4.5's rows as test_families' Ernie 4.5
# MoE's, Cohere2's parallel block as test_families' Cohere's (its biases added after the all-reduce as Phi-2's), OLMoE's
# whole-projection q/k norms and experts by width as test_families' OLMoE cuts them on two ranks (four ranks: the
# Gemma 3 seed above); MIXED programs on ranks, log-probabilities and prompt scores in the DeepSeek seed above.
SWEEP_SEEDS = (
    ("deepseek", 7, 2),   # latent attention, 6 heads (3 a rank: an odd share, as the gemma3 seed's), 4 routed
                          # experts, vocab 255, MIXED programs (the suite's DeepSeek seed until seed 163)
    ("olmoe", 0, 4),      # OLMoE: whole-projection q/k norms over 4 ranks (3 heads, 1 key/value head each), top-3
                          # of 8 experts of width 48 (12 a rank), q/k/v/o biases, the legacy rope layout
    ("bamba", 7, 2),      # Bamba: 2 mixer groups split over the ranks, vocab 255, MIXED programs
    ("llama_shaped", 7, 2),  # Ernie 4.5: de-interleaved q/k rows with their biases, llama3 rope, MIXED programs
    ("cohere", 7, 2),     # Cohere2: the parallel block with q/k/v/o biases (the partials summed once, the biases
                          # added after), the legacy sliding_window_pattern, tied, 4 heads on 2 ranks, MIXED programs
    ("gpt_oss", 18, 4),   # 12 query heads on 4 ranks (3 each, with their sinks), window 6, vocab 255, 8 experts
    ("moe", 6, 2),        # GLM-4 MoE: 6 heads, 2 routed experts of width 10 (5 a rank), 2 shared, vocab 131
    ("phi3", 9, 2),       # Phi-3 LongRoPE, 6 heads (3 a rank), untied, vocab 131
    ("smollm3", 14, 4),   # SmolLM3: a NoPE sliding second layer, 8 heads and 4 key/value heads on 4 ranks
    ("gemma3", 53, 2),    # Gemma 3: three sliding layers (window 3) then a full one, logit soft cap 5, linear
                          # global rope, the transformers 4 layout, 4 heads on 2 ranks, vocab 97, MIXED programs
    ("glm4", 15, 2),      # GLM-4 dense: interleaved partial rotary 0.5 with linear rope, q/k/v biases, sandwich
                          # norms, 4 heads on 2 ranks, vocab 97, MIXED programs
    ("olmo", 12, 4),      # OLMo 3: no pre-norms, whole-projection q/k norms over 4 ranks (one head each: the mean
                          # square summed over the ranks), sliding/full layers, the legacy rope layout, biases, tied
    ("starcoder2", 0, 4),  # StarCoder2: biased LayerNorms, the non-gated MLP (width 48, 12 a rank) with biases, q/k/v/o
                           # biases, window 5, linear rope in the legacy layout, 4 heads on 4 ranks, untied
    # Qwen2-MoE, Hunyuan MoE, Ernie 4.5 MoE, Granite MoE, Gemma / Gemma 2, Phi-2 and Qwen3-Next have no seed here
    # (the suite's time): tests/parallel/test_families.py runs each on two ranks, and HELIOS_RANK_FUZZ_SEEDS draws them.
)


def _cases() -> list[tuple[str, int, int]]:
    sweep = os.environ.get("HELIOS_RANK_FUZZ_SEEDS", "")  # "N": seeds 0..N-1; "A:B": seeds A..B-1
    if not sweep:
        return list(in_sweep("HELIOS_RANK_FUZZ_SWEEP", SEEDS, SWEEP_SEEDS))
    seeds = range(*(int(n) for n in sweep.split(":"))) if ":" in sweep else range(int(sweep))
    return [(kind, seed, ranks) for kind in DRAWS for seed in seeds for ranks in ranks_for(seed)]


@pytest.mark.parametrize("kind, seed, ranks", _cases(), ids=lambda value: str(value))
def test_drawn_variants_on_ranks_match_the_reference_or_are_refused_by_name(tmp_path, kind, seed, ranks):
    outcome = check_ranks(draw_cut(kind, seed, ranks), ranks, tmp_path, mixed=seed % 2 == 1)
    print(f"{kind} {seed} tp{ranks}: {outcome}")
