"""``helios::sample``: exact semantics against a plain Python reference, statistics, invariance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from helios.abi import rng, sampling
from helios.abi.grammar import mask_words, unpack_mask
from helios.abi.program_image import decode_program, encode_program
from helios.abi.registry import AbiArgumentError

NEG_INF = float("-inf")
F32_MAX = float(np.finfo(np.float32).max)
F64_MAX = float(np.finfo(np.float64).max)


def make_args(logits, **overrides) -> dict:
    """Inputs for ``helios::sample`` with every filter and penalty off, overridable per name."""
    logits = torch.as_tensor(logits, dtype=torch.float32)
    if logits.dim() == 1:
        logits = logits.unsqueeze(0)
    rows, vocab = logits.shape
    args = dict(
        logits=logits, seeds=torch.arange(rows, dtype=torch.int64),
        counters=torch.zeros(rows, dtype=torch.int64), temperature=torch.ones(rows),
        top_k=torch.zeros(rows, dtype=torch.int32), top_p=torch.ones(rows), min_p=torch.zeros(rows),
        penalties=torch.tensor([[1.0, 0.0, 0.0]]).repeat(rows, 1),
        prompt_counts=torch.zeros(rows, vocab, dtype=torch.int32),
        output_counts=torch.zeros(rows, vocab, dtype=torch.int32),
        grammar_mask=torch.full((rows, mask_words(vocab)), -1, dtype=torch.int32),
        mask_rows=torch.zeros(rows, dtype=torch.bool))
    for name, value in overrides.items():
        template = args[name]
        value = torch.as_tensor(value, dtype=template.dtype)
        args[name] = value.expand_as(template).clone()
    return args


def sample(args: dict) -> list[int]:
    return torch.ops.helios.sample(**args).tolist()


def repeat_rows(logits, num_rows: int, **overrides) -> dict:
    """`num_rows` copies of one row, each with its own seed."""
    row = torch.as_tensor(logits, dtype=torch.float32)
    args = make_args(row.repeat(num_rows, 1), **overrides)
    args["seeds"] = torch.arange(num_rows, dtype=torch.int64) * 7919 + 17
    return args


def mask_allowing(vocab: int, tokens: list[int]) -> list[int]:
    words = [0] * mask_words(vocab)
    for token in tokens:
        words[token // 32] |= 1 << (token % 32)
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


# ---------------------------------------------------------------- plain reference, one row


def reference_logits(args: dict, row: int) -> list[float]:
    """Steps 1-4 of the documented pipeline with Python floats and loops."""
    values = [float(v) for v in args["logits"][row].tolist()]
    repetition, presence, frequency = (float(p) for p in args["penalties"][row].tolist())
    prompt, output = args["prompt_counts"][row].tolist(), args["output_counts"][row].tolist()
    vocab = len(values)
    allowed = unpack_mask(args["grammar_mask"][row:row + 1], vocab)[0].tolist()
    masked = bool(args["mask_rows"][row])
    result = []
    for token, value in enumerate(values):
        value = NEG_INF if math.isnan(value) else min(value, F32_MAX)
        if prompt[token] > 0 or output[token] > 0:
            value = value / repetition if value > 0 else value * repetition
        if output[token] > 0:
            value = value - frequency * output[token] - presence
        if masked and not allowed[token]:
            value = NEG_INF
        result.append(NEG_INF if math.isnan(value) else min(value, F64_MAX))
    return result


def reference_weights(args: dict, row: int) -> tuple[list[int], list[float]]:
    """Canonical order and kept (unnormalised) probabilities of a drawing row (steps 6-7)."""
    temperature = float(args["temperature"][row])
    scaled = [min(v / temperature, F64_MAX) for v in reference_logits(args, row)]
    top = max(scaled)
    exps = [math.exp(v - top) for v in scaled]
    probs = [e / sum(exps) for e in exps]
    order = sorted(range(len(probs)), key=lambda t: (-probs[t], t))
    top_k, top_p = int(args["top_k"][row]), float(args["top_p"][row])
    min_p = float(args["min_p"][row])
    in_top_k = [top_k <= 0 or i < top_k for i in range(len(order))]
    top_k_mass = sum(probs[t] for i, t in enumerate(order) if in_top_k[i])
    weights, before = [], 0.0
    for i, token in enumerate(order):
        keep = in_top_k[i] and (top_p >= 1 or before < top_p * top_k_mass)
        keep = keep and probs[token] >= min_p * probs[order[0]]
        weights.append(probs[token] if keep or i == 0 else 0.0)
        before += probs[token] if in_top_k[i] else 0.0
    return order, weights


def reference_token(args: dict, row: int) -> int:
    values = reference_logits(args, row)
    if max(values) == NEG_INF:
        return -1
    if not float(args["temperature"][row]) > 0:
        return values.index(max(values))
    order, weights = reference_weights(args, row)
    words = rng.philox_words(args["seeds"][row:row + 1], args["counters"][row:row + 1], 0)
    target = float(rng.uniform53(words)[0]) * sum(weights)
    running, last = 0.0, max(i for i, w in enumerate(weights) if w > 0)
    for i, weight in enumerate(weights):
        running += weight
        if running > target:
            return order[min(i, last)]
    return order[last]


def random_args(num_rows: int, vocab: int, seed: int) -> dict:
    generator = np.random.default_rng(seed)
    logits = generator.normal(size=(num_rows, vocab)) * 3
    logits[generator.random((num_rows, vocab)) < 0.05] = -np.inf
    logits[:, 1] = logits[:, 2]  # exact ties in every row
    pick = lambda options: torch.tensor(generator.choice(options, size=num_rows))
    counts = lambda: torch.from_numpy(
        (generator.random((num_rows, vocab)) < 0.1) * generator.integers(1, 4, (num_rows, vocab)))
    penalties = np.stack([generator.choice([1.0, 0.7, 1.5], num_rows),
                          generator.choice([0.0, 0.5, -0.3], num_rows),
                          generator.choice([0.0, 0.2], num_rows)], axis=1)
    mask = generator.integers(-2**31, 2**31, (num_rows, mask_words(vocab)))
    mask[: num_rows // 20] = 0  # some rows allow nothing
    return make_args(
        logits, seeds=torch.from_numpy(generator.integers(-2**62, 2**62, num_rows)),
        counters=torch.from_numpy(generator.integers(0, 10**6, num_rows)),
        temperature=pick([0.0, 0.3, 1.0, 1.7, -1.0]), top_k=pick([0, 1, 3, 10, 500]),
        top_p=pick([1.0, 0.95, 0.5, 1e-6]), min_p=pick([0.0, 0.05, 0.3]),
        penalties=torch.from_numpy(penalties), prompt_counts=counts(), output_counts=counts(),
        grammar_mask=torch.from_numpy(mask), mask_rows=pick([True, False]))


# ---------------------------------------------------------------- agreement with the reference


def test_matches_plain_reference_on_random_rows():
    args = random_args(400, 70, seed=1)
    tokens = sample(args)
    assert tokens == [reference_token(args, row) for row in range(400)]
    assert tokens.count(-1) >= 5 and len(set(tokens)) > 30


def test_device_path_matches_host_row_selection():
    args = random_args(200, 40, seed=2)
    params = sampling.DrawParams(*(args[name] for name in sampling.DrawParams._fields))
    values = torch.randn(200, 40, dtype=torch.float64)
    greedy = values.argmax(dim=-1)
    drawing = args["temperature"] > 0
    host = sampling.with_draws(greedy, values, drawing, params, select_rows=True)
    device = sampling.with_draws(greedy, values, drawing, params, select_rows=False)
    assert torch.equal(host, device)
    assert not torch.equal(host, greedy)


def test_penalty_step_matches_formula():
    args = random_args(50, 30, seed=3)
    logits = args["logits"].double().nan_to_num(nan=NEG_INF, posinf=F32_MAX, neginf=NEG_INF)
    out = sampling.apply_penalties(logits, args["penalties"], args["prompt_counts"],
                                   args["output_counts"])
    no_mask = dict(args, mask_rows=torch.zeros(50, dtype=torch.bool))
    expected = [reference_logits(no_mask, row) for row in range(50)]
    assert out.tolist() == expected


# ---------------------------------------------------------------- exact filter semantics


def test_greedy_takes_lowest_id_among_ties_and_ignores_randomness_and_filters():
    args = repeat_rows([1.0, 3.0, 3.0, 2.0], 50, temperature=0.0, top_k=3, top_p=0.1, min_p=0.5)
    args["counters"] = torch.arange(50)
    assert sample(args) == [1] * 50
    assert sample(repeat_rows([1.0, 3.0, 3.0, 2.0], 5, temperature=-2.0)) == [1] * 5
    assert sample(repeat_rows([1.0, 3.0, 3.0, 2.0], 5, temperature=float("nan"))) == [1] * 5


def test_top_k_keeps_exactly_k_tokens_breaking_ties_by_id():
    tokens = sample(repeat_rows([1.0, 3.0, 3.0, 3.0, 0.0], 3000, top_k=2))
    assert set(tokens) == {1, 2}
    assert set(sample(repeat_rows([1.0, 3.0, 3.0, 3.0, 0.0], 3000, top_k=1))) == {1}


def test_top_k_at_or_beyond_vocabulary_is_off():
    logits = torch.randn(20)
    off = sample(repeat_rows(logits, 500))
    assert sample(repeat_rows(logits, 500, top_k=20)) == off
    assert sample(repeat_rows(logits, 500, top_k=10**6)) == off
    assert sample(repeat_rows(logits, 500, top_k=-3)) == off
    assert len(set(off)) > 10


def test_top_p_keeps_shortest_prefix_reaching_mass():
    logits = [math.log(p) for p in (0.4, 0.3, 0.2, 0.1)]
    assert set(sample(repeat_rows(logits, 3000, top_p=0.69))) == {0, 1}
    assert set(sample(repeat_rows(logits, 3000, top_p=0.71))) == {0, 1, 2}
    assert set(sample(repeat_rows(logits, 3000, top_p=1.0))) == {0, 1, 2, 3}


def test_tiny_or_zero_top_p_keeps_the_first_canonical_token():
    assert set(sample(repeat_rows([0.0, 5.0, 5.0, 1.0], 500, top_p=1e-9))) == {1}
    assert set(sample(repeat_rows([0.0, 5.0, 5.0, 1.0], 500, top_p=0.0))) == {1}


def test_top_p_applies_after_top_k_over_renormalised_mass():
    logits = [math.log(p) for p in (0.4, 0.3, 0.2, 0.1)]
    # Over the full distribution 0.55 keeps tokens 0 and 1; over top-2 (mass 0.7) only token 0.
    assert set(sample(repeat_rows(logits, 2000, top_p=0.55))) == {0, 1}
    assert set(sample(repeat_rows(logits, 2000, top_p=0.55, top_k=2))) == {0}


def test_temperature_applies_before_top_p():
    logits = [math.log(9.0), 0.0]  # p = 0.9, 0.1 at temperature 1
    assert set(sample(repeat_rows(logits, 2000, top_p=0.85))) == {0}
    assert set(sample(repeat_rows(logits, 2000, top_p=0.85, temperature=3.0))) == {0, 1}


def test_min_p_is_relative_to_the_top_probability_and_inclusive():
    logits = [2.0, 2.0, 0.0, 0.0]  # p ratio exp(-2) ~ 0.135
    assert set(sample(repeat_rows(logits, 2000, min_p=0.13))) == {0, 1, 2, 3}
    assert set(sample(repeat_rows(logits, 2000, min_p=0.14))) == {0, 1}
    assert set(sample(repeat_rows(logits, 2000, min_p=1.0))) == {0, 1}
    assert set(sample(repeat_rows(logits, 500, min_p=5.0))) == {0}


def test_inverse_cdf_boundaries_and_zero_weight_tokens(monkeypatch):
    def fixed_uniform(value):
        monkeypatch.setattr(sampling, "uniform53", lambda words: torch.full(
            (words.shape[0],), value, dtype=torch.float64))

    equal = [0.0, 0.0, 0.0, 0.0]  # p = 0.25 each; C = 0.25, 0.5, 0.75, 1.0
    for value, token in ((0.0, 0), (0.2499, 0), (0.25, 1), (0.5, 2), (1 - 2**-53, 3)):
        fixed_uniform(value)
        assert sample(make_args(equal)) == [token]
    fixed_uniform(1 - 2**-53)
    assert sample(make_args([0.0, 0.0, 0.0, NEG_INF])) == [2]
    assert sample(make_args([0.0, 0.0, -1e4, -1e4])) == [1]  # exp underflows to 0
    assert sample(make_args([0.0, 1.0, 2.0, 3.0], top_k=2)) == [2]


# ---------------------------------------------------------------- penalties


def test_repetition_penalty_covers_prompt_and_output_counts_by_sign():
    logits = [2.0, 1.5, -1.0, -1.2]
    prompt = torch.tensor([[1, 0, 0, 0]], dtype=torch.int32)
    assert sample(make_args(logits, temperature=0.0)) == [0]
    assert sample(make_args(logits, temperature=0.0, penalties=[[2.0, 0.0, 0.0]],
                            prompt_counts=prompt)) == [1]
    # A negative logit is multiplied: -1.0 * 2 = -2.0 < -1.2.
    only_negatives = [NEG_INF, NEG_INF, -1.0, -1.2]
    output = torch.tensor([[0, 0, 1, 0]], dtype=torch.int32)
    assert sample(make_args(only_negatives, temperature=0.0, penalties=[[2.0, 0.0, 0.0]],
                            output_counts=output)) == [3]


def test_presence_and_frequency_count_output_tokens_only():
    logits = [1.0, 0.8, 0.0]
    prompt = torch.tensor([[5, 0, 0]], dtype=torch.int32)
    off = dict(temperature=0.0, prompt_counts=prompt)
    assert sample(make_args(logits, penalties=[[1.0, 0.5, 0.5]], **off)) == [0]
    once = torch.tensor([[1, 0, 0]], dtype=torch.int32)
    assert sample(make_args(logits, temperature=0.0, penalties=[[1.0, 0.3, 0.0]],
                            output_counts=once)) == [1]  # 1.0 - 0.3 < 0.8
    assert sample(make_args(logits, temperature=0.0, penalties=[[1.0, 0.0, 0.15]],
                            output_counts=once)) == [0]  # 1.0 - 0.15 > 0.8
    thrice = torch.tensor([[3, 0, 0]], dtype=torch.int32)
    assert sample(make_args(logits, temperature=0.0, penalties=[[1.0, 0.0, 0.15]],
                            output_counts=thrice)) == [1]  # 1.0 - 0.45 < 0.8


# ---------------------------------------------------------------- grammar mask and odd logits


def test_grammar_mask_limits_draws_in_masked_rows_only():
    vocab = 70
    args = repeat_rows(torch.zeros(vocab), 2000, grammar_mask=mask_allowing(vocab, [3, 40, 69]))
    args["mask_rows"][1::2] = True
    tokens = sample(args)
    assert set(tokens[1::2]) == {3, 40, 69}
    assert len(set(tokens[0::2])) > 60


def test_greedy_respects_mask_and_no_allowed_token_gives_no_token():
    vocab = 40
    args = make_args(torch.arange(vocab, dtype=torch.float32).repeat(3, 1),
                     temperature=[0.0, 1.0, 0.0], mask_rows=[True, True, False])
    args["grammar_mask"] = torch.tensor([mask_allowing(vocab, [5, 7]), [0, 0], [0, 0]],
                                        dtype=torch.int32)
    assert sample(args) == [7, sampling.NO_TOKEN, 39]


def test_nan_is_disallowed_and_positive_infinity_wins():
    nan, inf = float("nan"), float("inf")
    assert sample(make_args([nan, 1.0, 2.0, nan], temperature=0.0)) == [2]
    assert set(sample(repeat_rows([nan, 1.0, 1.0, nan], 500))) == {1, 2}
    assert sample(make_args([nan, nan], temperature=0.0)) == [-1]
    assert sample(make_args([nan, nan])) == [-1]
    assert set(sample(repeat_rows([0.0, inf, 5.0, inf], 500))) == {1, 3}
    assert sample(make_args([0.0, inf, 5.0, inf], temperature=0.0)) == [1]


# ---------------------------------------------------------------- invariance and determinism


def test_a_request_gets_the_same_token_alone_or_in_any_batch():
    args = random_args(60, 300, seed=4)
    batch = sample(args)
    for row in range(0, 60, 7):
        alone = {name: value[row:row + 1] for name, value in args.items()}
        assert sample(alone) == [batch[row]]
    order = torch.randperm(60, generator=torch.Generator().manual_seed(0))
    shuffled = sample({name: value[order] for name, value in args.items()})
    assert shuffled == [batch[i] for i in order.tolist()]


def test_draws_depend_on_seed_and_counter_only():
    args = repeat_rows(torch.zeros(1000), 64)
    first = sample(args)
    assert sample(args) == first
    args["counters"] = torch.full((64,), 1)
    assert sum(a != b for a, b in zip(first, sample(args))) > 55
    one_seed = repeat_rows(torch.zeros(1000), 64)
    one_seed["seeds"] = torch.full((64,), 5)
    assert len(set(sample(one_seed))) == 1
    one_seed["counters"] = torch.arange(64)
    assert len(set(sample(one_seed))) > 55


def test_empty_batch():
    assert sample(make_args(torch.zeros(0, 10))) == []


# ---------------------------------------------------------------- statistics


def empirical_check(counts: np.ndarray, target: np.ndarray) -> bool:
    """Chi-square (p ~ 1e-6 bound for <= 9 degrees of freedom) over tokens with mass; none
    drawn where the target has none."""
    total = counts.sum()
    support = target > 0
    expected = total * target[support]
    chi_square = float((((counts[support] - expected) ** 2) / expected).sum())
    return chi_square < 45.0 and counts[~support].sum() == 0


@pytest.mark.parametrize("settings", [
    dict(temperature=1.0),
    dict(temperature=0.8, top_k=7, top_p=0.9, min_p=0.05, penalties=[[1.3, 0.2, 0.1]]),
])
def test_empirical_frequencies_match_filtered_distribution(settings):
    num_rows, vocab = 60_000, 10
    logits = torch.tensor([1.2, 0.3, 2.0, -0.5, 1.9, 0.0, -2.0, 1.0, 0.8, 1.5])
    output = torch.tensor([[0, 2, 1, 0, 0, 0, 0, 3, 0, 0]], dtype=torch.int32)
    args = repeat_rows(logits, num_rows, output_counts=output, **settings)
    args["counters"] = torch.arange(num_rows) % 97
    counts = np.bincount(np.array(sample(args)), minlength=vocab)
    order, weights = reference_weights(args, 0)
    target = np.zeros(vocab)
    target[order] = np.array(weights) / sum(weights)
    assert empirical_check(counts, target)
    # The same check rejects a 2% shift of probability between two supported tokens.
    shifted = target.copy()
    donor, receiver = order[0], order[1]
    shifted[donor] -= 0.02
    shifted[receiver] += 0.02
    assert not empirical_check(counts, shifted)


# ---------------------------------------------------------------- argument checks and export


@pytest.mark.parametrize("name,bad", [
    ("logits", torch.zeros(4, 40, dtype=torch.float16)),
    ("logits", torch.zeros(40)),
    ("seeds", torch.zeros(4, dtype=torch.int32)),
    ("counters", torch.zeros(3, dtype=torch.int64)),
    ("temperature", torch.zeros(4, dtype=torch.float64)),
    ("top_k", torch.zeros(4, dtype=torch.int64)),
    ("top_p", torch.zeros(4, 1)),
    ("min_p", torch.zeros(5)),
    ("penalties", torch.zeros(4, 2)),
    ("prompt_counts", torch.zeros(4, 41, dtype=torch.int32)),
    ("output_counts", torch.zeros(4, 40, dtype=torch.int64)),
    ("grammar_mask", torch.zeros(4, 1, dtype=torch.int32)),
    ("mask_rows", torch.zeros(4, dtype=torch.uint8)),
    ("seeds", torch.zeros(4, dtype=torch.int64, device="meta")),
])
def test_argument_errors_name_the_argument(name, bad):
    args = make_args(torch.zeros(4, 40))
    args[name] = bad
    wanted = "one device" if bad.device.type == "meta" else name
    with pytest.raises(AbiArgumentError, match=wanted):
        torch.ops.helios.sample(**args)


class _SampleModule(torch.nn.Module):
    def forward(self, hidden, weight, seeds, counters, temperature, top_k, top_p, min_p,
                penalties, prompt_counts, output_counts, grammar_mask, mask_rows):
        logits = hidden @ weight
        return torch.ops.helios.sample(logits, seeds, counters, temperature, top_k, top_p, min_p,
                                       penalties, prompt_counts, output_counts, grammar_mask,
                                       mask_rows)


def test_op_survives_export_save_and_load_with_a_dynamic_batch():
    names = [name for name in make_args(torch.zeros(1, 50)) if name != "logits"]
    weight = torch.randn(8, 50)

    def inputs(num_rows: int, seed: int) -> tuple:
        args = random_args(num_rows, 50, seed=seed)
        hidden = torch.randn(num_rows, 8, generator=torch.Generator().manual_seed(seed))
        return (hidden, weight, *(args[name] for name in names))

    rows = torch.export.Dim("rows", min=2, max=1024)
    dynamic = [{0: rows}, None, *({0: rows} for _ in names)]
    program = torch.export.export(_SampleModule(), inputs(16, 5), dynamic_shapes=dynamic,
                                  strict=False)
    loaded = decode_program(encode_program(program)).module()  # stored as a program image
    for num_rows, seed in ((16, 5), (41, 6)):
        expected = _SampleModule()(*inputs(num_rows, seed))
        assert torch.equal(loaded(*inputs(num_rows, seed)), expected)
        assert expected.dtype == torch.int64 and expected.shape == (num_rows,)


@pytest.mark.gpu
def test_reference_on_cuda_matches_cpu_and_replays_in_a_cuda_graph():
    args = random_args(400, 70, seed=1)
    expected = torch.ops.helios.sample(**args)
    static = {name: value.cuda() for name, value in args.items()}
    assert torch.equal(torch.ops.helios.sample(**static).cpu(), expected)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.helios.sample(**static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torch.ops.helios.sample(**static)
    other = random_args(400, 70, seed=6)
    for name, value in other.items():
        static[name].copy_(value)
    graph.replay()
    assert torch.equal(captured.cpu(), torch.ops.helios.sample(**other))
