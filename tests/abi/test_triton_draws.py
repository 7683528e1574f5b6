"""The sort-free draw kernel (`helios.abi.triton_draws.draw_rows`) against the reference's sorted draws.

Without CUDA the kernels run under Triton's interpreter on CPU tensors; with CUDA compiled. Each row's
expected token is `helios.abi.sampling.sample_reference`'s (a stable sort of the whole row, prefix sums
in canonical order). The kernel selects instead, with sums in another order: the inputs are drawn so
that no boundary comparison is within rounding, and every row must get exactly the reference's token.
The rows are built to reach each branch of the selection: ties (equal logits, whole rows of one value,
the tied group holding the crossing), masked tokens (p = 0) inside top-k, the crossing in the first
histogram's last bucket (tiny probabilities), min-p above 1, one-token rows, tiny temperatures.
"""

from __future__ import annotations

import os

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi.rng import SAMPLE_OFFSET, philox_words, uniform53  # noqa: E402
from helios.abi.sampling import DrawParams, _F32_MAX, _finite_or_neg_inf, sample_reference  # noqa: E402
from helios.abi.triton_draws import draw_rows  # noqa: E402
from support.sweeps import in_sweep, swept  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"


def rows_of(logits, temperature, top_k, top_p, min_p, seed):
    rows = logits.shape[0]
    generator = torch.Generator().manual_seed(seed)
    params = DrawParams(torch.randint(-2**62, 2**62, (rows,), generator=generator),
                        torch.randint(0, 10**6, (rows,), generator=generator), temperature,
                        top_k.to(torch.int32), top_p, min_p)
    return logits, params


def reference(logits, params):
    rows, vocab = logits.shape
    return sample_reference(logits, params, torch.tensor([[1.0, 0.0, 0.0]] * rows),
                            (torch.zeros(rows, vocab, dtype=torch.int32),) * 2,
                            torch.zeros(rows, (vocab + 31) // 32, dtype=torch.int32),
                            torch.zeros(rows, dtype=torch.bool))


def kernel(logits, params):
    """draw_rows on the reference's step 1-4 values (no penalties or masks: the float32 logits)."""
    values = _finite_or_neg_inf(logits.to(torch.float64), _F32_MAX)
    has_candidate = values.amax(dim=-1) > float("-inf")
    greedy = torch.where(has_candidate, values.argmax(dim=-1), -1)
    drawing = (params.temperature > 0) & has_candidate
    uniforms = uniform53(philox_words(params.seeds, params.counters, SAMPLE_OFFSET))
    args = [t.to(DEVICE) for t in (values, greedy, drawing, params.temperature, params.top_k, params.top_p,
                                   params.min_p, uniforms)]
    return draw_rows(*args).cpu()


def assert_reference_tokens(logits, params):
    expected = reference(logits, params)
    got = kernel(logits, params)
    differ = (got != expected).nonzero().flatten().tolist()
    assert not differ, [(row, int(expected[row]), int(got[row])) for row in differ]
    return expected


def controls(generator, rows, vocab):
    temperature = 0.2 + 1.6 * torch.rand(rows, generator=generator)
    top_k = torch.where(torch.rand(rows, generator=generator) < 0.5, 0,
                        torch.randint(1, vocab + 3, (rows,), generator=generator))
    top_p = torch.where(torch.rand(rows, generator=generator) < 0.4, 1.0, torch.rand(rows, generator=generator))
    min_p = torch.where(torch.rand(rows, generator=generator) < 0.6, 0.0, 0.2 * torch.rand(rows, generator=generator))
    return temperature, top_k, top_p, min_p


KINDS = ("gaussian", "bfloat16", "halves", "masked")
# The kinds the tests run: "halves" (few values, large tied groups) with HELIOS_KERNEL_SWEEP=1 only; ties
# (bfloat16 here, large tied groups in test_many_uniforms_over_tied_groups, whole rows of one value in
# test_edge_rows_get_the_reference_tokens) take the same paths by default.
SUITE_KINDS = in_sweep("HELIOS_KERNEL_SWEEP", ("gaussian", "bfloat16", "masked"), ("halves",))


def kind_logits(kind: str, rows: int, vocab: int) -> tuple[torch.Tensor, torch.Generator]:
    """Gaussian logits [rows, vocab] of random row scales as `kind` shapes them, and the generator
    (seeded by the kind) that drew them, for the test's controls."""
    generator = torch.Generator().manual_seed(KINDS.index(kind))
    logits = torch.randn(rows, vocab, generator=generator) * (1 + 5 * torch.rand(rows, 1, generator=generator))
    if kind == "bfloat16":  # many equal logits: tied groups in the canonical order (and across a kept boundary)
        logits = logits.to(torch.bfloat16).float()
    elif kind == "halves":  # few distinct values, large tied groups
        logits = (logits * 2).round() / 2
    elif kind == "masked":  # p = 0 tokens, also inside top-k's count
        logits[torch.rand(rows, vocab, generator=generator) < 0.7] = float("-inf")
    return logits, generator


@pytest.mark.parametrize("kind", SUITE_KINDS)
def test_random_rows_get_the_reference_tokens(kind):
    """Twelve rows of random controls (each of top-k, top-p and min-p on in about half of them) a kind."""
    rows, vocab = 12, 900
    logits, generator = kind_logits(kind, rows, vocab)
    expected = assert_reference_tokens(*rows_of(logits, *controls(generator, rows, vocab), seed=rows))
    assert len(set(expected.tolist())) > rows // 2  # rows really draw different tokens


def test_edge_rows_get_the_reference_tokens():
    rows, vocab = 10, 700
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(rows, vocab, generator=generator) * 3
    temperature, top_k, top_p, min_p = (torch.full((rows,), 1.0), torch.zeros(rows), torch.ones(rows),
                                        torch.zeros(rows))
    logits[0] = 2.0  # one value everywhere: the draw is a position among equal tokens
    logits[1, 3:] = float("-inf")  # three candidates
    logits[2, :] = float("-inf")
    logits[2, 500] = 0.0  # one candidate
    temperature[3] = 1e-30  # z values ~1e30 apart: every token but the largest gets p = 0
    min_p[4] = 1.5  # keeps the first position only
    top_k[5] = vocab - 1  # the k-th token deep in the tail (the first histogram's last bucket)
    logits[5, :4] += 400.0
    top_p[6] = 1e-6  # keeps the first position only
    logits[7, 100:160] = 9.0  # a tied group at the top holding the crossing
    top_k[7] = 37  # ... and top-k's boundary inside it
    logits[8] = torch.linspace(-700.0, 0.0, vocab)  # probabilities over the whole float64 range
    top_k[9] = vocab + 5  # top-k off by size
    assert_reference_tokens(*rows_of(logits, temperature, top_k, top_p, min_p, seed=3))


def test_many_uniforms_over_tied_groups():
    """Twenty draws of one row of five tied groups: every position among equal tokens goes by id."""
    vocab = 300
    base = torch.tensor([4.0, 3.0, 3.0, 1.0, 0.0]).repeat_interleave(torch.tensor([7, 50, 3, 100, 140]))
    logits = base[torch.randperm(vocab, generator=torch.Generator().manual_seed(5))].repeat(20, 1)
    rows = logits.shape[0]
    expected = assert_reference_tokens(*rows_of(logits, torch.full((rows,), 0.7), torch.zeros(rows),
                                                torch.full((rows,), 0.999), torch.zeros(rows), seed=8))
    assert len(set(expected.tolist())) > 10


def test_a_row_draws_the_same_token_alone_and_in_any_batch():
    generator = torch.Generator().manual_seed(21)
    rows, vocab = 6, 2500  # a vocabulary over several blocks and splits
    logits = torch.randn(rows, vocab, generator=generator) * 4
    logits, params = rows_of(logits, *controls(generator, rows, vocab), seed=9)
    together = kernel(logits, params)
    order = torch.randperm(rows, generator=generator)
    assert torch.equal(kernel(logits[order], params.rows(order)), together[order])
    for row in (0, rows - 1):
        index = torch.tensor([row])
        assert torch.equal(kernel(logits[index], params.rows(index)), together[index])


def test_rows_that_do_not_draw_keep_their_greedy_token():
    generator = torch.Generator().manual_seed(4)
    rows, vocab = 4, 400
    logits = torch.randn(rows, vocab, generator=generator)
    temperature = torch.tensor([0.0, 1.0, 0.0, 1.0])
    expected = assert_reference_tokens(*rows_of(logits, temperature, torch.zeros(rows), torch.ones(rows),
                                                torch.zeros(rows), seed=1))
    assert expected[0] == logits[0].argmax() and expected[2] == logits[2].argmax()


def test_top_p_keeps_positions_whose_preceding_mass_is_strictly_below():
    """Four equal tokens (p = 1/4 exactly) and top_p 1/2: the mass before the third is exactly 1/2,
    not below it, so only the two lowest ids are drawn - sixteen draws, the reference's tokens."""
    rows, vocab = 16, 64
    logits = torch.full((rows, vocab), float("-inf"))
    logits[:, [9, 20, 33, 60]] = 1.5
    expected = assert_reference_tokens(*rows_of(logits, torch.ones(rows), torch.zeros(rows), torch.full((rows,), 0.5),
                                                torch.zeros(rows), seed=2))
    assert set(expected.tolist()) == {9, 20}


def test_controls_outside_their_ranges_follow_the_reference():
    """The op takes any float32 controls (the server validates its own): a NaN top_p keeps the first
    position alone, as the reference's ``below`` (a comparison with NaN) does - the kernel took it
    for top-p off - and infinite or NaN top_p and min_p, and a top_k past the vocabulary, act as there."""
    rows, vocab = 10, 300
    generator = torch.Generator().manual_seed(17)
    logits = torch.randn(rows, vocab, generator=generator) * 2
    nan, inf = float("nan"), float("inf")
    top_p = torch.tensor([nan, nan, nan, inf, -inf, 1.0, 0.9, 1.0, 1.0, 0.5])
    min_p = torch.tensor([0.0, 0.0, 0.1, 0.0, 0.0, nan, nan, inf, -inf, 0.0])
    top_k = torch.tensor([0, 7, 0, 0, 0, 0, 0, 0, 3, vocab + 1])
    expected = assert_reference_tokens(*rows_of(logits, torch.full((rows,), 2.0), top_k, top_p, min_p, seed=6))
    first = logits.argmax(dim=-1)
    assert torch.equal(expected[:3], first[:3]) and not torch.equal(expected[8:], first[8:])


# 150 seeds (1,800 rows): none differ. One in the suite (wide gaussians; the other shapes' cases have tests of
# their own above), six (each shape once) with HELIOS_KERNEL_SWEEP=1, or HELIOS_DRAW_SWEEP_SEEDS of them.
SWEEP_SEEDS = int(os.environ.get("HELIOS_DRAW_SWEEP_SEEDS", "6" if swept("HELIOS_KERNEL_SWEEP") else "1"))


def sweep_rows(seed: int):
    """Twelve rows of one of six shapes (wide gaussians, rounded ties, few values, 80% masked, logits
    spread over 800 (probabilities down to the float64 tail), tied groups of 2**n with top_p in
    1/32 steps: exact boundaries), vocabularies of 1 to 3,000, top_k from -1 to V + 1, temperatures
    down to 1e-3."""
    generator = torch.Generator().manual_seed(1000 + seed)
    rows, kind = 12, seed % 6
    vocab = int(torch.randint(1, 3000 if seed % 3 else 40, (1,), generator=generator))
    scale = float(torch.rand(1, generator=generator)) * 60
    logits = torch.randn(rows, vocab, generator=generator) * scale
    if kind == 1:
        logits = logits.round()
    elif kind == 2:
        logits = (logits / max(scale, 1)).round() * 0.5
    elif kind == 3:
        logits[torch.rand(rows, vocab, generator=generator) < 0.8] = float("-inf")
    elif kind == 4:
        logits = torch.linspace(-800, 0, vocab).repeat(rows, 1)[:, torch.randperm(vocab, generator=generator)]
    elif kind == 5:
        logits = torch.full((rows, vocab), float("-inf"))
        size = 2 ** int(torch.randint(0, 6, (1,), generator=generator))
        for row in range(rows):
            logits[row, torch.randperm(vocab, generator=generator)[:size]] = 1.0
    temperature = torch.where(torch.rand(rows, generator=generator) < 0.1, 1e-3,
                              0.05 + 2 * torch.rand(rows, generator=generator))
    top_k = torch.where(torch.rand(rows, generator=generator) < 0.4, 0,
                        torch.randint(-1, vocab + 2, (rows,), generator=generator))
    fractions = torch.randint(0, 33, (rows,), generator=generator) / 32.0 if kind == 5 else \
        torch.rand(rows, generator=generator)
    top_p = torch.where(torch.rand(rows, generator=generator) < 0.3, 1.0, fractions)
    min_p = torch.where(torch.rand(rows, generator=generator) < 0.5, 0.0, 0.5 * torch.rand(rows, generator=generator))
    return rows_of(logits, temperature, top_k, top_p, min_p, seed=seed)


@pytest.mark.parametrize("seed", range(SWEEP_SEEDS))
def test_swept_rows_get_the_reference_tokens(seed):
    """HELIOS_DRAW_SWEEP_SEEDS sets the seed count (1 in the suite)."""
    assert_reference_tokens(*sweep_rows(seed))
