"""``helios::sample``'s sampling distribution against transformers' logits processors and the OpenAI
definition of presence and frequency penalties (a differential test; tests/abi/test_sampling.py
checks the op against its own docstring).

The reference distribution of a row is built from the reference implementations, in float64 on the
row's float32 values (the op's own precision): `RepetitionPenaltyLogitsProcessor` over the prompt
and output ids, then ``logit -= presence * (count > 0) + frequency * count`` over the output ids
(OpenAI), then `TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper` and
`MinPLogitsWarper`, and the softmax. That is transformers' default order (`generate` builds the
warpers temperature, top-k, top-p, min-p, after the repetition penalty) and the order Helios
documents (`helios.abi.sampling`, steps 2 and 5-7); vLLM applies its penalties in the same order.

Ties at a filter's boundary are the one place the definitions differ: transformers' top-k keeps every
token tied with the k-th value (vLLM's too), and its top-p sorts with an unstable sort, so which of
several tied tokens straddling the nucleus stays is unspecified. Helios documents exactly k tokens
and a canonical order (probability descending, lowest id first among ties). The reference keeps
transformers' arithmetic and applies that documented rule to the tokens it keeps: after top-k, only
the first k in canonical order; after top-p, each group of tied tokens keeps as many tokens as
transformers kept of it, the lowest ids. Min-p has no such choice (tied tokens fall on the same
side of its threshold).

How the distribution is observed: ``helios::sampling_weights`` returns it (the weights
``helios::sample`` draws from, which speculative verification uses), compared token by token. The
op itself draws by inverse CDF over its kept tokens in canonical order with a uniform u (its
docstring, step 8); the tests replace the uniform by chosen values (`probe_uniforms`): the middle
of every kept token's reference interval and points 1e-9 inside both of its ends, u = 0 and
u = 1 - 2**-53 (the last kept token, where its probability exceeds 1e-9). Each probe must give the
reference token, which fixes every kept token's probability to within 1e-9 and the kept set (a
token kept by one side only moves u = 1 - 2**-53 to another token). The two computations are
float64 with different summation orders (about 1e-15 apart), far inside the 1e-9 margin, so the
comparison is deterministic. Seeded draws with the real generator are checked the same way and with
a chi-square test of their frequencies. Each pipeline is run: the CPU's row selection, the device
path (`selective` false, what a CUDA graph runs) and the fused Triton pass (interpreted on the CPU,
compiled where CUDA is present).

Where vLLM differs (not compared here): it applies min-p before top-k and top-p, so its nucleus is
taken over the min-p survivors' mass; transformers and Helios take it before min-p.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from transformers.generation.logits_process import (  # noqa: E402
    MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
    TopPLogitsWarper)

from helios.abi import rng, sampling  # noqa: E402
from helios.abi.grammar import mask_words  # noqa: E402
from support.sweeps import swept  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
EDGE = 1e-9  # how far inside a reference interval the edge probes sit
LAST_UNIFORM = 1.0 - 2.0**-53  # the largest uniform53 value


def f32(value: float) -> float:
    """`value` as the op's float32 parameter row holds it."""
    return float(np.float32(value))


# ---------------------------------------------------------------- the reference distribution


def canonical(scores: torch.Tensor) -> list[int]:
    """Token ids in canonical order of float64 scores [V]: descending, the lowest id first on ties."""
    values = scores.tolist()
    return sorted(range(len(values)), key=lambda token: (-values[token], token))


def first_k_canonical(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Transformers' top-k survivors cut to the first `top_k` in canonical order (Helios' tie rule)."""
    order = canonical(scores)
    drop = torch.tensor(order[top_k:], dtype=torch.int64)
    return scores.index_fill(0, drop, -math.inf) if drop.numel() else scores


def lowest_ids_of_ties(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """`after` (top-p of `before`) with each tie group keeping as many tokens, the lowest ids."""
    result = before.clone()
    kept = after > -math.inf
    for value in torch.unique(before[before > -math.inf]).tolist():
        group = (before == value).nonzero().squeeze(-1)  # ascending ids
        count = int(kept[group].sum())
        result[group[count:]] = -math.inf
    return result


def reference_probs(logits, settings: dict, prompt_ids=(), output_ids=()) -> torch.Tensor:
    """float64 [V]: the row's sampling distribution from transformers' processors (module docstring)."""
    scores = torch.as_tensor(np.asarray(logits, dtype=np.float32)).to(torch.float64).unsqueeze(0)
    vocab = scores.shape[1]
    input_ids = torch.tensor([list(prompt_ids) + list(output_ids)], dtype=torch.int64)
    repetition = f32(settings.get("repetition", 1.0))
    if repetition != 1.0 and input_ids.numel():
        scores = RepetitionPenaltyLogitsProcessor(repetition)(input_ids, scores)
    counts = torch.bincount(torch.tensor(list(output_ids), dtype=torch.int64), minlength=vocab).to(torch.float64)
    presence, frequency = f32(settings.get("presence", 0.0)), f32(settings.get("frequency", 0.0))
    scores = scores - (presence * (counts > 0) + frequency * counts)  # OpenAI: generated tokens only
    scores = TemperatureLogitsWarper(f32(settings["temperature"]))(input_ids, scores)
    top_k = settings.get("top_k", 0)
    if 0 < top_k < vocab:
        scores = first_k_canonical(TopKLogitsWarper(top_k)(input_ids, scores)[0], top_k).unsqueeze(0)
    top_p = f32(settings.get("top_p", 1.0))
    if top_p < 1.0:
        scores = lowest_ids_of_ties(scores[0], TopPLogitsWarper(top_p)(input_ids, scores)[0]).unsqueeze(0)
    min_p = f32(settings.get("min_p", 0.0))
    if min_p > 0.0:
        scores = MinPLogitsWarper(min_p)(input_ids, scores)
    return torch.softmax(scores[0], dim=-1)


def support_order(probs: torch.Tensor) -> list[int]:
    """The reference's kept tokens (probability > 0) in canonical order."""
    return [token for token in canonical(probs) if probs[token] > 0]


def inverse_cdf(probs: torch.Tensor) -> tuple[list[int], np.ndarray]:
    """(kept tokens in canonical order, their cumulative probabilities normalised to end at 1)."""
    order = support_order(probs)
    cumulative = np.cumsum([float(probs[token]) for token in order])
    return order, cumulative / cumulative[-1]


def probe_uniforms(probs: torch.Tensor, max_tokens: int = 40) -> tuple[list[float], list[int]]:
    """(uniforms, the reference token of each): u = 0 (the first kept token), the middle of kept
    tokens' intervals (the first and last `max_tokens // 2` of the canonical order when more are
    kept) and points `EDGE` inside both ends of those wider than 4 * EDGE, and the largest uniform
    (the last kept token) when that token's interval is wider than EDGE. Intervals narrower than
    1e-12 (a tail under a dominant token) cannot be told apart from their neighbours at float64
    resolution and are not probed."""
    order, cumulative = inverse_cdf(probs)
    lower = np.concatenate([[0.0], cumulative[:-1]])
    chosen = range(len(order)) if len(order) <= max_tokens else \
        [*range(max_tokens // 2), *range(len(order) - max_tokens // 2, len(order))]
    uniforms, tokens = [0.0], [order[0]]
    if 1.0 - lower[-1] > EDGE:
        uniforms.append(LAST_UNIFORM)
        tokens.append(order[-1])
    for position in chosen:
        low, high = lower[position], cumulative[position]
        if high - low > 1e-12:
            uniforms.append((low + high) / 2)
            tokens.append(order[position])
        if high - low > 4 * EDGE:
            uniforms += [low + EDGE, high - EDGE]
            tokens += [order[position]] * 2
    return uniforms, tokens


# ---------------------------------------------------------------- the op's inputs and pipelines


def sample_args(logits, rows: int, settings: dict, prompt_ids=(), output_ids=()) -> dict:
    """``helios::sample`` arguments: `rows` copies of one row with `settings`, no grammar mask."""
    row = torch.as_tensor(np.asarray(logits, dtype=np.float32))
    vocab = row.shape[0]
    counts = lambda ids: torch.bincount(torch.tensor(list(ids), dtype=torch.int64),  # noqa: E731
                                        minlength=vocab).to(torch.int32).repeat(rows, 1)
    column = lambda name, default, dtype=torch.float32: torch.full(  # noqa: E731
        (rows,), settings.get(name, default), dtype=dtype)
    penalties = torch.tensor([[settings.get("repetition", 1.0), settings.get("presence", 0.0),
                               settings.get("frequency", 0.0)]], dtype=torch.float32).repeat(rows, 1)
    return dict(
        logits=row.repeat(rows, 1), seeds=torch.arange(rows, dtype=torch.int64) * 7919 + 3,
        counters=torch.arange(rows, dtype=torch.int64), temperature=column("temperature", 1.0),
        top_k=column("top_k", 0, torch.int32), top_p=column("top_p", 1.0), min_p=column("min_p", 0.0),
        penalties=penalties, prompt_counts=counts(prompt_ids), output_counts=counts(output_ids),
        grammar_mask=torch.full((rows, mask_words(vocab)), -1, dtype=torch.int32),
        mask_rows=torch.zeros(rows, dtype=torch.bool))


def run_host(args: dict) -> list[int]:
    return torch.ops.helios.sample(**args).tolist()


def run_device_path(args: dict) -> list[int]:
    """The op's capturable path (every row computed, tokens selected), on CPU tensors."""
    original = sampling.selective
    sampling.selective = lambda device: False
    try:
        return torch.ops.helios.sample(**args).tolist()
    finally:
        sampling.selective = original


def run_fused(args: dict) -> list[int]:
    """Steps 1-5 in the fused Triton pass (`sample_with_kernel`), the draws on its stored values."""
    moved = {name: value.to(DEVICE) for name, value in args.items()}
    params = sampling.DrawParams(*(moved[name] for name in sampling.DrawParams._fields))
    return sampling.sample_with_kernel(moved["logits"], params, moved["penalties"],
                                       (moved["prompt_counts"], moved["output_counts"]), moved["grammar_mask"],
                                       moved["mask_rows"]).tolist()


PIPELINES = {"host": run_host, "device_path": run_device_path, "fused": run_fused}


def with_uniforms(monkeypatch, uniforms: list[float]) -> None:
    """Every draw of the next calls uses `uniforms` (one per row) instead of Philox's."""
    fixed = torch.tensor(uniforms, dtype=torch.float64)
    monkeypatch.setattr(sampling, "uniform53", lambda words: fixed.to(words.device))


def assert_probes_match(monkeypatch, pipeline: str, logits, settings: dict, prompt_ids=(), output_ids=(),
                        max_tokens: int = 40):
    probs = reference_probs(logits, settings, prompt_ids, output_ids)
    uniforms, expected = probe_uniforms(probs, max_tokens)
    with_uniforms(monkeypatch, uniforms)
    tokens = PIPELINES[pipeline](sample_args(logits, len(uniforms), settings, prompt_ids, output_ids))
    mismatches = [(u, got, want) for u, got, want in zip(uniforms, tokens, expected) if got != want]
    assert not mismatches, f"{len(mismatches)} of {len(uniforms)} probes differ; first (u, got, want): {mismatches[:5]}"
    return probs


# ---------------------------------------------------------------- cases


def normal_logits(vocab: int, seed: int, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=vocab) * scale).astype(np.float32)


def penalised_row(vocab: int, seed: int) -> tuple[np.ndarray, list[int], list[int]]:
    """Logits with positive and negative values, and prompt and output ids (some repeated)."""
    generator = np.random.default_rng(seed)
    logits = normal_logits(vocab, seed)
    prompt = generator.integers(0, vocab, 12).tolist()
    output = generator.integers(0, vocab, 8).tolist() + [int(np.argmax(logits))] * 3
    return logits, prompt, output


def biased_row(vocab: int, seed: int) -> np.ndarray:
    """Logits with -100 added at some ids (``logit_bias`` -100, float32 as the program adds it),
    an exact -inf at others and +100 at one id."""
    logits = normal_logits(vocab, seed)
    logits[::5] = logits[::5] + np.float32(-100.0)
    logits[1::7] = -np.inf
    logits[3] = logits[3] + np.float32(100.0)
    return logits


CASES = {
    "temperature_1": (normal_logits(64, 1), dict(temperature=1.0)),
    "temperature_tiny": (normal_logits(1000, 2), dict(temperature=1e-4)),
    "temperature_small": (normal_logits(1000, 3), dict(temperature=0.05)),
    "temperature_large": (normal_logits(1000, 4), dict(temperature=50.0)),
    "top_k": (normal_logits(1000, 5), dict(temperature=0.7, top_k=10)),
    "top_k_is_vocab": (normal_logits(64, 6), dict(temperature=1.0, top_k=64)),
    "top_k_beyond_vocab": (normal_logits(64, 6), dict(temperature=1.0, top_k=10_000)),
    "top_k_1": (normal_logits(300, 7), dict(temperature=1.5, top_k=1)),
    "top_p": (normal_logits(1000, 8), dict(temperature=1.3, top_p=0.9)),
    "top_p_one": (normal_logits(64, 9), dict(temperature=1.0, top_p=1.0)),
    "top_p_tiny": (normal_logits(1000, 10), dict(temperature=1.0, top_p=1e-7)),
    "min_p": (normal_logits(1000, 11), dict(temperature=1.0, min_p=0.1)),
    "min_p_one": (normal_logits(64, 12), dict(temperature=1.0, min_p=1.0)),
    "top_k_then_top_p": (normal_logits(1000, 13, 1.0), dict(temperature=1.0, top_k=40, top_p=0.5)),
    "all_filters": (normal_logits(4099, 14, 2.0), dict(temperature=0.8, top_k=300, top_p=0.8, min_p=0.02)),
    "biased": (biased_row(1000, 15), dict(temperature=1.0)),
    "biased_filtered": (biased_row(257, 16), dict(temperature=2.0, top_p=0.95, min_p=0.001)),
}

# Ties at every filter's boundary (see the module docstring for the reference's tie rule).
TIED = np.array([2.0, 1.0, 3.0, 1.0, 3.0, 1.0, 0.5, 3.0, 1.0, -1.0, 3.0, 1.0], dtype=np.float32)
TIE_CASES = {
    "all_equal": (np.zeros(64, dtype=np.float32), dict(temperature=1.0)),
    "all_equal_top_k": (np.zeros(64, dtype=np.float32), dict(temperature=1.0, top_k=5)),
    "all_equal_top_p_exact_boundary": (np.zeros(64, dtype=np.float32), dict(temperature=1.0, top_p=0.5)),
    "all_equal_top_p": (np.zeros(64, dtype=np.float32), dict(temperature=1.0, top_p=0.3)),
    "all_equal_min_p_one": (np.zeros(64, dtype=np.float32), dict(temperature=1.0, min_p=1.0)),
    "top_k_splits_a_tie": (TIED, dict(temperature=1.0, top_k=2)),
    "top_k_splits_a_lower_tie": (TIED, dict(temperature=1.0, top_k=7)),
    "top_p_splits_a_tie": (TIED, dict(temperature=1.0, top_p=0.5)),
    "min_p_at_a_tie": (TIED, dict(temperature=1.0, min_p=math.exp(-2.0))),
    "min_p_one_keeps_the_tied_top": (TIED, dict(temperature=1.0, min_p=1.0)),
}


@pytest.mark.parametrize("pipeline", ["host", "device_path"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_distribution_matches_transformers_processors(monkeypatch, pipeline, case):
    logits, settings = CASES[case]
    probs = assert_probes_match(monkeypatch, pipeline, logits, settings)
    assert float(probs.sum()) == pytest.approx(1.0)


@pytest.mark.parametrize("pipeline", ["host", "device_path"])
@pytest.mark.parametrize("case", sorted(TIE_CASES))
def test_ties_at_filter_boundaries(monkeypatch, pipeline, case):
    logits, settings = TIE_CASES[case]
    assert_probes_match(monkeypatch, pipeline, logits, settings)


def test_the_tie_cases_keep_what_the_documented_rule_says():
    """The reference's tie rule, spelled out on the tie cases (so the probes test what is meant)."""
    kept = lambda case: sorted(support_order(reference_probs(*TIE_CASES[case])))  # noqa: E731
    assert kept("all_equal_top_k") == [0, 1, 2, 3, 4]  # transformers would keep all 64
    assert kept("all_equal_top_p_exact_boundary") == list(range(32))  # mass before < 0.5
    assert kept("all_equal_top_p") == list(range(20))  # 19 * 1/64 < 0.3 <= 20 * 1/64
    assert kept("all_equal_min_p_one") == list(range(64))
    assert kept("top_k_splits_a_tie") == [2, 4]  # the four 3.0s: the two lowest ids
    assert kept("top_k_splits_a_lower_tie") == [0, 1, 2, 3, 4, 7, 10]  # 3.0s, 2.0, then 1.0s by id
    assert kept("min_p_at_a_tie") == [0, 1, 2, 3, 4, 5, 7, 8, 10, 11]  # exp(1 - 3) is inclusive
    assert kept("min_p_one_keeps_the_tied_top") == [2, 4, 7, 10]
    top_k = TopKLogitsWarper(2)(None, torch.from_numpy(TIED).double().unsqueeze(0))
    assert int((top_k > -math.inf).sum()) == 4  # transformers keeps every tie of the k-th value


@pytest.mark.parametrize("pipeline", ["host", "device_path"])
@pytest.mark.parametrize("settings", [
    dict(temperature=1.0, repetition=1.3),
    dict(temperature=1.0, repetition=0.7),  # below 1 boosts seen tokens (transformers allows it)
    dict(temperature=1.0, presence=0.5, frequency=0.25),
    dict(temperature=1.0, presence=-1.0, frequency=-0.5),  # OpenAI's negative values boost
    dict(temperature=0.9, repetition=1.2, presence=0.75, frequency=0.5, top_k=50, top_p=0.9, min_p=0.01),
], ids=["repetition", "repetition_below_1", "presence_frequency", "negative_presence_frequency", "everything"])
def test_penalties_match_repetition_processor_and_openai(monkeypatch, pipeline, settings):
    logits, prompt_ids, output_ids = penalised_row(500, 20)
    probs = assert_probes_match(monkeypatch, pipeline, logits, settings, prompt_ids, output_ids)
    assert not torch.allclose(probs, reference_probs(logits, dict(temperature=settings["temperature"])))


def test_presence_and_frequency_ignore_prompt_ids(monkeypatch):
    """OpenAI's penalties count generated tokens only: prompt ids alone change nothing."""
    logits, prompt_ids, _ = penalised_row(200, 21)
    settings = dict(temperature=1.0, presence=1.5, frequency=1.0)
    probs = assert_probes_match(monkeypatch, "host", logits, settings, prompt_ids, ())
    assert torch.equal(probs, reference_probs(logits, dict(temperature=1.0)))


# The fused pipeline's draws run the Triton kernels under the interpreter here (about 10 s a probed case):
# the suite probes the cases below; HELIOS_FUSED_PROBES_ALL=1 adds top-p over a 1000-id row and the two tie
# cases, which test_triton_draws checks kernel-side (ties, strict top-p) against the reference in the suite,
# and probes every kept token of the penalised row (the suite: its first and last five).
_FUSED_ALL = swept("HELIOS_FUSED_PROBES_ALL")


@pytest.mark.parametrize("case", ["top_k", "biased_filtered", "temperature_tiny", *(["top_p"] if _FUSED_ALL else [])])
def test_fused_pass_gives_the_reference_distribution(monkeypatch, case):
    logits, settings = CASES[case]
    assert_probes_match(monkeypatch, "fused", logits, settings)


def test_fused_pass_with_penalties_and_ties(monkeypatch):
    """The penalised row's first and last five kept tokens (32 probes; every kept token's, 53, with
    HELIOS_FUSED_PROBES_ALL=1): the penalties change the values every position is drawn from, and each
    middle position's draw takes the branch the unpenalised fused cases above probe at every position."""
    logits, prompt_ids, output_ids = penalised_row(300, 22)
    settings = dict(temperature=0.9, repetition=1.2, presence=0.75, frequency=0.5, top_k=50, top_p=0.9)
    assert_probes_match(monkeypatch, "fused", logits, settings, prompt_ids, output_ids,
                        max_tokens=40 if _FUSED_ALL else 10)
    for case in ("top_k_splits_a_lower_tie", "all_equal_top_p") if _FUSED_ALL else ():
        assert_probes_match(monkeypatch, "fused", *TIE_CASES[case])


@pytest.mark.parametrize("case", ["top_k", "biased", "temperature_1"])
def test_greedy_is_the_argmax_after_penalties(case):
    """Temperature 0: transformers' greedy choice (the argmax of the penalised scores, first id on ties)."""
    logits, _ = CASES[case]
    _, prompt_ids, output_ids = penalised_row(len(logits), 23)
    settings = dict(temperature=0.0, repetition=1.5, presence=0.5, frequency=0.5)
    args = sample_args(logits, 1, settings, prompt_ids, output_ids)
    penalised = reference_probs(logits, dict(settings, temperature=1.0), prompt_ids, output_ids)
    assert run_host(args) == [int(torch.argmax(penalised))]
    assert run_fused(args) == run_host(args)
    assert run_host(sample_args(TIED, 1, dict(temperature=0.0))) == [2]  # the first of the tied maxima


# ---------------------------------------------------------------- seeded draws (the real generator)


def seeded_draws(logits, settings: dict, num_draws: int, pipeline: str = "host") -> tuple[list[int], torch.Tensor]:
    args = sample_args(logits, num_draws, settings)
    args["seeds"] = torch.full((num_draws,), -(2**63) + 12345, dtype=torch.int64)  # one request's seed
    uniforms = rng.uniform53(rng.philox_words(args["seeds"], args["counters"], rng.SAMPLE_OFFSET))
    return PIPELINES[pipeline](args), uniforms


@pytest.mark.parametrize("pipeline", ["host", "device_path", "fused"])
def test_seeded_draws_are_inverse_cdf_draws_of_the_reference(pipeline):
    """Each draw with the request's seed and its counter is the reference token at the generator's
    uniform (docstring step 8), except within EDGE of an interval's end where float64 summation
    order may decide: such draws are left out (none expected: each falls there with probability
    2 * EDGE per boundary)."""
    logits, settings = CASES["all_filters" if pipeline != "fused" else "top_k_then_top_p"]
    num_draws = 1000 if pipeline != "fused" else 50  # the interpreted kernel is slow (about 0.3 s a draw)
    probs = reference_probs(logits, settings)
    tokens, uniforms = seeded_draws(logits, settings, num_draws, pipeline)
    order, cumulative = inverse_cdf(probs)
    uniforms = uniforms.numpy()
    positions = np.minimum(np.searchsorted(cumulative, uniforms, side="right"), len(order) - 1)
    clear = np.abs(cumulative[None, :] - uniforms[:, None]).min(axis=1) > EDGE
    assert clear.sum() >= num_draws - 5
    assert np.array(tokens)[clear].tolist() == np.array(order)[positions][clear].tolist()
    assert len(set(tokens)) > 10


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    support = probs > 0
    return float((((counts[support] - expected[support]) ** 2) / expected[support]).sum())


@pytest.mark.parametrize("settings", [
    dict(temperature=1.0),
    dict(temperature=0.6, top_k=6, top_p=0.85, min_p=0.05, repetition=1.4, presence=0.3, frequency=0.2),
])
def test_seeded_frequencies_match_the_reference(settings):
    """Frequencies of 40,000 seeded draws against the reference probabilities, without the
    generator's arithmetic: chi-square below 80 with at most 11 degrees of freedom (a correct
    sampler fails with probability about 1e-12; the seeds are fixed, so the outcome is too), no
    draw outside the reference's kept set, and the same statistic rejects the reference with 3%
    of the probability moved from the top token to the second."""
    logits = np.array([1.2, 0.3, 2.0, -0.5, 1.9, 0.0, -2.0, 1.0, 0.8, 1.5, 0.1, -0.2], dtype=np.float32)
    prompt_ids, output_ids = [0, 0, 5, 9], [2, 2, 7, 11]
    probs = reference_probs(logits, settings, prompt_ids, output_ids).numpy()
    args = sample_args(logits, 40_000, settings, prompt_ids, output_ids)
    args["seeds"] = torch.arange(40_000, dtype=torch.int64) // 100 * 104729 - 2**40
    args["counters"] = torch.arange(40_000, dtype=torch.int64) % 100
    counts = np.bincount(np.array(run_host(args)), minlength=len(logits))
    assert counts[probs == 0].sum() == 0
    assert chi_square(counts, probs) < 80.0
    order = np.argsort(-probs, kind="stable")
    shifted = probs.copy()
    shifted[order[0]] -= 0.03
    shifted[order[1]] += 0.03
    assert chi_square(counts, shifted) > 80.0


# ---------------------------------------------------------------- the distribution itself


PENALTY_SETTINGS = dict(temperature=0.9, repetition=1.2, presence=0.75, frequency=0.5, top_k=50, top_p=0.9, min_p=0.01)


@pytest.mark.parametrize("case", sorted(CASES) + sorted(TIE_CASES) + ["penalised"])
def test_sampling_weights_are_the_reference_distribution(case):
    """``helios::sampling_weights`` (the distribution ``helios::sample`` draws from, which speculative
    programs verify against) normalised: the reference's kept set exactly and every probability to
    1e-9 relative; `draw_weighted` of it at the sampling offset draws `sample`'s tokens."""
    if case == "penalised":
        logits, prompt_ids, output_ids = penalised_row(500, 20)
        settings = PENALTY_SETTINGS
    else:
        (logits, settings), prompt_ids, output_ids = {**CASES, **TIE_CASES}[case], (), ()
    args = sample_args(logits, 64, settings, prompt_ids, output_ids)
    weights = torch.ops.helios.sampling_weights(
        args["logits"], args["temperature"], args["top_k"], args["top_p"], args["min_p"], args["penalties"],
        args["prompt_counts"], args["output_counts"], args["grammar_mask"], args["mask_rows"])
    expected = reference_probs(logits, settings, prompt_ids, output_ids)
    distribution = weights[0] / weights[0].sum()
    assert torch.equal(distribution > 0, expected > 0)
    torch.testing.assert_close(distribution, expected, rtol=1e-9, atol=1e-15)
    drawn = torch.ops.helios.draw_weighted(weights, args["seeds"], args["counters"], rng.SAMPLE_OFFSET)
    assert drawn.tolist() == run_host(args)
