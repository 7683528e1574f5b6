"""The speculative ops' CUDA paths (`helios::sampling_weights`, `draw_weighted`, `verify_proposals`'
draws) against their sorted references.

Without CUDA the kernels run under Triton's interpreter on CPU tensors (the CUDA registrations are
called directly); with CUDA compiled. The kernels select the kept prefix and the inverse-CDF position
instead of sorting (`helios.abi.triton_draws`): the kept tokens must be exactly the reference's, their
probabilities equal up to softmax rounding, and every draw the reference's token (the inputs keep
boundary comparisons clear of rounding). Rows reach each branch: ties across the kept boundary, a
whole row of one value, masked tokens, greedy and NaN-temperature rows, rows with no allowed token,
weights with a single positive entry or none.
"""

from __future__ import annotations

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi import speculative  # noqa: E402
from helios.abi.grammar import mask_words  # noqa: E402
from helios.abi.rng import SAMPLE_OFFSET  # noqa: E402
from helios.abi.sampling import DrawParams, sample_reference  # noqa: E402
from support.abi_inputs import control_inputs, seeds_and_counters, verify_inputs  # noqa: E402

from abi.test_triton_draws import SUITE_KINDS, SWEEP_SEEDS, kind_logits, sweep_rows  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"


def plain_controls(logits, temperature, top_k, top_p, min_p) -> dict:
    """``sampling_weights`` arguments without penalties or grammar masks."""
    rows, vocab = logits.shape
    return dict(logits=logits, temperature=temperature, top_k=top_k.to(torch.int32), top_p=top_p, min_p=min_p,
                penalties=torch.tensor([[1.0, 0.0, 0.0]] * rows),
                prompt_counts=torch.zeros(rows, vocab, dtype=torch.int32),
                output_counts=torch.zeros(rows, vocab, dtype=torch.int32),
                grammar_mask=torch.zeros(rows, mask_words(vocab), dtype=torch.int32),
                mask_rows=torch.zeros(rows, dtype=torch.bool))


def on_device(arguments: dict) -> dict:
    return {name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for name, value in arguments.items()}


def selected_weights(arguments: dict) -> torch.Tensor:
    return speculative._sampling_weights_cuda(**on_device(arguments)).cpu()


def reference_weights(arguments: dict) -> torch.Tensor:
    names = ("temperature", "top_k", "top_p", "min_p")
    return speculative.sampling_weights_reference(
        arguments["logits"], tuple(arguments[name] for name in names), arguments["penalties"],
        (arguments["prompt_counts"], arguments["output_counts"]), arguments["grammar_mask"], arguments["mask_rows"])


def assert_reference_weights(arguments: dict) -> torch.Tensor:
    expected, got = reference_weights(arguments), selected_weights(arguments)
    differ = ((got > 0) != (expected > 0)).any(dim=-1).nonzero().flatten().tolist()
    assert not differ, [(row, (expected[row] > 0).sum().item(), (got[row] > 0).sum().item()) for row in differ]
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    return expected


def selected_draws(weights, seeds, counters, offset):
    return speculative.draw_selected(weights.to(DEVICE), seeds.to(DEVICE), counters.to(DEVICE), offset).cpu()


def assert_reference_draws(weights, seed: int, offset: int = SAMPLE_OFFSET) -> torch.Tensor:
    seeds, counters = seeds_and_counters(weights.shape[0], torch.Generator().manual_seed(seed))
    expected = speculative.draw_reference(weights, seeds, counters, offset)
    got = selected_draws(weights, seeds, counters, offset)
    differ = (got != expected).nonzero().flatten().tolist()
    assert not differ, [(row, int(expected[row]), int(got[row])) for row in differ]
    return expected


@pytest.mark.parametrize("kind", SUITE_KINDS)  # "halves" with HELIOS_KERNEL_SWEEP=1 (test_triton_draws' note)
def test_weights_keep_the_reference_tokens(kind):
    rows, vocab = 10, 900
    logits, generator = kind_logits(kind, rows, vocab)
    temperature = 0.2 + 1.6 * torch.rand(rows, generator=generator)
    temperature[::5] = 0.0  # greedy rows: one-hot
    top_k = torch.where(torch.rand(rows, generator=generator) < 0.3, 0,
                        torch.randint(1, vocab + 3, (rows,), generator=generator))
    top_p = torch.where(torch.rand(rows, generator=generator) < 0.3, 1.0, torch.rand(rows, generator=generator))
    min_p = torch.where(torch.rand(rows, generator=generator) < 0.6, 0.0, 0.2 * torch.rand(rows, generator=generator))
    expected = assert_reference_weights(plain_controls(logits, temperature, top_k, top_p, min_p))
    kept = (expected > 0).sum(dim=-1)
    assert (kept > 1).sum() >= rows // 3 and (kept[::5] == 1).all()


def test_weights_of_penalised_and_masked_rows():
    """Every control of the op (penalties, grammar masks, NaN and infinite logits, a row whose grammar
    allows nothing: all zeros) through the fused pass and the selection."""
    arguments = control_inputs(12, 2000, seed=5)
    arguments["top_k"][3] = 1  # a one-token prefix
    expected = assert_reference_weights(arguments)
    assert not expected[6].any()  # control_inputs' row that allows nothing


def test_ties_at_the_kept_boundary_go_by_id():
    """Top-k's boundary inside a tied group keeps its lowest ids: 37 of 60 equal tokens, whatever
    their ids' order in the row (a kernel that kept ids < the boundary's, or every tied id, fails)."""
    rows, vocab = 3, 500
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(rows, vocab, generator=generator)
    tied = torch.randperm(vocab, generator=generator)[:60]
    logits[:, tied] = 9.0
    ones = torch.ones(rows)
    expected = assert_reference_weights(plain_controls(logits, ones, torch.tensor([37, 1, 60]), ones, 0 * ones))
    assert (expected > 0).sum(dim=-1).tolist() == [37, 1, 60]
    assert set((expected[0] > 0).nonzero().flatten().tolist()) == set(tied.sort().values[:37].tolist())


def test_a_vocabulary_over_every_split_keeps_the_reference_weights_and_draws():
    """17,000 ids: every split of the whole-row passes loops over more than one block and the last one
    is partial, and top-k's boundary falls inside a tied group spread over several splits (its lowest
    ids kept, whichever split holds them); an infinite temperature (every token equal), min_p -inf and
    NaN (all kept; the first position only)."""
    rows, vocab = 4, 17000
    logits, _ = kind_logits("halves", rows, vocab)
    boundary = logits[1].sort(descending=True).values[8999:9001]
    assert boundary[0] == boundary[1] and (logits[1] == boundary[0]).sum() > 1000
    temperature = torch.tensor([0.7, 1.3, float("inf"), 0.9])
    top_k, top_p = torch.tensor([0, 9000, 0, 5]), torch.tensor([0.9, 1.0, 1.0, 0.8])
    min_p = torch.tensor([0.0, float("-inf"), 0.0, float("nan")])
    expected = assert_reference_weights(plain_controls(logits, temperature, top_k, top_p, min_p))
    assert (expected > 0).sum(dim=-1).tolist()[1:] == [9000, vocab, 1]
    assert_reference_draws(expected, seed=3)


def test_rows_of_one_value_and_edge_controls():
    rows, vocab = 8, 700
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(rows, vocab, generator=generator) * 3
    temperature, top_k, top_p, min_p = torch.ones(rows), torch.zeros(rows), torch.ones(rows), torch.zeros(rows)
    logits[0] = 2.0  # one value everywhere: top_p keeps the lowest ids
    top_p[0] = 0.25
    temperature[1] = float("nan")  # greedy, as the reference's `temperature > 0`
    logits[2, :] = float("-inf")  # no allowed token: all zeros
    temperature[3] = 1e-30  # every token but the largest has p = 0
    min_p[4] = 1.5  # keeps the first position only
    top_p[5] = float("nan")  # keeps the first position only
    top_k[6] = vocab - 1  # the k-th token deep in the tail
    logits[6, :4] += 400.0
    logits[7] = torch.linspace(-700.0, 0.0, vocab)  # probabilities over the whole float64 range
    top_p[7] = 0.999
    expected = assert_reference_weights(plain_controls(logits, temperature, top_k, top_p, min_p))
    kept = (expected > 0).sum(dim=-1).tolist()
    assert 170 <= kept[0] <= 180 and kept[1:6] == [1, 0, 1, 1, 1]  # row 0: 700 x 1/700 summed to 1/4


def test_a_row_gets_the_same_weights_alone_and_in_any_batch():
    arguments = control_inputs(6, 2500, seed=9)
    together = selected_weights(arguments)
    order = torch.randperm(6, generator=torch.Generator().manual_seed(1))
    permuted = {name: value[order] for name, value in arguments.items()}
    assert torch.equal(selected_weights(permuted), together[order])
    alone = {name: value[4:5] for name, value in arguments.items()}
    assert torch.equal(selected_weights(alone), together[4:5])


def test_draws_from_sampling_weights_get_the_reference_tokens():
    arguments = control_inputs(12, 2000, seed=13)
    arguments["temperature"] = 0.3 + torch.rand(12, generator=torch.Generator().manual_seed(3))
    expected = assert_reference_draws(reference_weights(arguments), seed=4)
    assert len(set(expected.tolist())) > 6


def test_draws_from_tied_zero_and_single_weights():
    """Residual-like weights: ties (the position among equal weights goes by id), rows with one
    positive weight (drawn whatever the uniform), rows without one (-1), and tiny weights."""
    rows, vocab = 20, 300
    generator = torch.Generator().manual_seed(6)
    weights = torch.tensor([0.25, 0.125, 0.125, 0.0]).repeat_interleave(torch.tensor([7, 50, 3, 240]))
    weights = weights[torch.randperm(vocab, generator=generator)].to(torch.float64).repeat(rows, 1)
    weights[12:] = 0.0
    weights[12:15, 17] = 3.0  # one positive weight
    weights[15:18, :5] = 1e-300  # tiny equal weights
    expected = assert_reference_draws(weights, seed=7, offset=2)
    assert (expected[18:] == -1).all() and (expected[12:15] == 17).all()
    assert len(set(expected[:12].tolist())) > 6


def test_verification_with_selected_draws_matches_the_reference():
    """The bonus and residual draws of `verify_reference` through the selection: the same emitted
    tokens and acceptance counts."""
    accepted = []
    for lanes, width, drafts, seed in ((6, 4, 3, 0), (9, 3, 2, 1)):
        inputs = verify_inputs(lanes, width, drafts, 600, seed=seed)
        expected = speculative.verify_reference(**inputs)
        got = speculative._verify_proposals_cuda(**on_device(inputs))
        for actual, wanted in zip(got, expected):
            assert torch.equal(actual.cpu(), wanted)
        accepted += expected[1].tolist()
    assert max(accepted) > 0


def test_weights_then_draw_equal_the_sampled_token():
    """draw_weighted(sampling_weights(x)) is ``helios::sample``(x): with selection on both steps the
    same tokens as the reference sampler's."""
    arguments = control_inputs(8, 1500, seed=21)
    seeds, counters = seeds_and_counters(8, torch.Generator().manual_seed(8))
    drawn = selected_draws(selected_weights(arguments), seeds, counters, SAMPLE_OFFSET)
    names = ("temperature", "top_k", "top_p", "min_p")
    params = DrawParams(seeds, counters, *(arguments[name] for name in names))
    expected = sample_reference(arguments["logits"], params, arguments["penalties"],
                                (arguments["prompt_counts"], arguments["output_counts"]), arguments["grammar_mask"],
                                arguments["mask_rows"])
    assert torch.equal(drawn, expected)


@pytest.mark.parametrize("seed", range(SWEEP_SEEDS))
def test_swept_rows_keep_the_reference_weights_and_draws(seed):
    """test_triton_draws' sweep (HELIOS_DRAW_SWEEP_SEEDS seeds, 1 in the suite): each row's kept set
    and weights, and a draw from the reference's weights, through the selection."""
    logits, params = sweep_rows(seed)
    arguments = plain_controls(logits, params.temperature, params.top_k, params.top_p, params.min_p)
    assert_reference_draws(assert_reference_weights(arguments), seed=seed)
