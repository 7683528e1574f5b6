"""The fused greedy kernel of ``helios::sample`` against the reference pipeline, token for token.

Without CUDA the kernel runs under Triton's interpreter on CPU tensors (`enable_interpreter` sets
TRITON_INTERPRET=1 before triton is first imported); with CUDA it runs compiled. Every row's
expected token is the reference's for that row with temperature 0 (a non-drawing row): penalties,
grammar masks, NaN, infinities, rows that allow nothing, and ties (lowest id wins) included.
"""

from __future__ import annotations

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi.sampling import DrawParams, NO_TOKEN, SampleVariant, sample_reference, sample_with_kernel  # noqa: E402
from helios.abi.triton_sampling import greedy_splits, greedy_tokens  # noqa: E402
from support.abi_inputs import sample_inputs  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"


def reference_greedy(inputs: dict) -> torch.Tensor:
    zero = torch.zeros_like(inputs["temperature"])
    params = DrawParams(inputs["seeds"], inputs["counters"], zero, inputs["top_k"], inputs["top_p"], inputs["min_p"])
    return sample_reference(inputs["logits"], params, inputs["penalties"],
                            (inputs["prompt_counts"], inputs["output_counts"]), inputs["grammar_mask"],
                            inputs["mask_rows"])


def kernel_greedy(inputs: dict) -> torch.Tensor:
    names = ("logits", "penalties", "prompt_counts", "output_counts", "grammar_mask", "mask_rows")
    return greedy_tokens(*(inputs[name].to(DEVICE) for name in names)).cpu()


@pytest.mark.parametrize("rows, vocab, seed", [(7, 4099, 0), (3, 50, 1), (1, 6000, 2)])
def test_greedy_kernel_gives_the_reference_tokens(rows, vocab, seed):
    inputs = sample_inputs(rows, vocab, seed)
    expected = reference_greedy(inputs)
    assert torch.equal(kernel_greedy(inputs), expected)
    if rows > 2:
        assert expected[rows // 2] == NO_TOKEN  # the row whose grammar allows nothing


def test_ties_take_the_lowest_id_across_blocks_and_splits():
    rows, vocab = 4, 5000
    inputs = sample_inputs(rows, vocab, 3)
    logits = torch.full((rows, vocab), -1.0)
    logits[0, [4000, 2100, 4999]] = 2.0  # tie across splits: lowest id wins
    logits[1, [17, 18]] = float("inf")  # +inf is float32 max: a tie
    logits[1, 3] = torch.finfo(torch.float32).max
    logits[2] = float("nan")  # nothing above -inf
    logits[3, [4090, 4091]] = 5.0
    inputs.update(logits=logits, mask_rows=torch.zeros(rows, dtype=torch.bool),
                  penalties=torch.tensor([[1.0, 0.0, 0.0]] * rows))
    expected = reference_greedy(inputs)
    assert expected.tolist() == [2100, 3, NO_TOKEN, 4090]
    assert torch.equal(kernel_greedy(inputs), expected)


def test_penalties_change_the_winner_only_in_penalised_rows():
    rows, vocab = 2, 300
    inputs = sample_inputs(rows, vocab, 4)
    logits = torch.zeros(rows, vocab)
    logits[:, 10], logits[:, 20] = 3.0, 2.0
    counts = torch.zeros(rows, vocab, dtype=torch.int32)
    counts[:, 10] = 2
    inputs.update(logits=logits, output_counts=counts, prompt_counts=torch.zeros_like(counts),
                  mask_rows=torch.zeros(rows, dtype=torch.bool),
                  penalties=torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.5, 0.1]]))
    assert reference_greedy(inputs).tolist() == [10, 20]
    assert kernel_greedy(inputs).tolist() == [10, 20]


def test_splits_are_powers_of_two_and_cover_batch_one():
    assert greedy_splits(1, 128256) == 64
    assert greedy_splits(256, 128256) == 2
    assert greedy_splits(512, 128256) == 1
    assert greedy_splits(1, 50) == 1


def test_the_greedy_variant_takes_the_kernel_only_on_cuda():
    inputs = sample_inputs(4, 300, 5)
    tokens = SampleVariant.GREEDY(**inputs)  # on the CPU the reference: drawing rows keep the greedy token
    assert torch.equal(tokens, reference_greedy(inputs))


@pytest.mark.parametrize("rows, vocab, seed", [(8, 3000, 6), (5, 700, 7)])
def test_the_kernel_pipeline_with_draws_gives_the_reference_tokens(rows, vocab, seed):
    """The full pipeline with the fused pass and the draw kernel: drawn rows (temperatures > 0,
    top-k/p, min-p) and greedy rows get the reference's tokens exactly (the draw kernel's sums round
    otherwise; no boundary of these rows is that close)."""
    cpu = sample_inputs(rows, vocab, seed)
    expected = torch.ops.helios.sample(**cpu)  # the CPU op: the reference pipeline
    drawn = cpu["temperature"] > 0
    assert bool((expected[drawn] != reference_greedy(cpu)[drawn]).any())  # the inputs really draw
    inputs = {name: value.to(DEVICE) for name, value in cpu.items()}
    params = DrawParams(*(inputs[name] for name in DrawParams._fields))
    arguments = (inputs["logits"], params, inputs["penalties"], (inputs["prompt_counts"], inputs["output_counts"]),
                 inputs["grammar_mask"], inputs["mask_rows"])
    assert torch.equal(sample_with_kernel(*arguments).cpu(), expected)
    assert torch.equal(sample_with_kernel(*arguments, draws=False).cpu(), reference_greedy(cpu))


@pytest.mark.parametrize("splits", [None, 8])
def test_neutral_rows_reduce_in_float32_with_the_float64_results(splits):
    """Rows with neutral penalties take the float32 reduction: the same tokens and stored float64 values
    as the float64 reduction (and the reference), with NaN, +inf, ties and masked rows among them;
    penalised rows keep float64. Any split count gives them too."""
    rows, vocab = 6, 5000
    inputs = sample_inputs(rows, vocab, 8)
    logits = inputs["logits"].clone()
    logits[0, [10, 4000]] = float("inf")  # +inf is float32 max: a tie, the lowest id wins
    logits[0, 20] = torch.finfo(torch.float32).max
    logits[2, ::7] = float("nan")
    logits[4, [1234, 4321]] = 9.0  # a tie across splits
    penalties = inputs["penalties"].clone()
    penalties[::2] = torch.tensor([1.0, 0.0, 0.0])  # rows 0, 2, 4 neutral; 1, 3, 5 as drawn
    inputs.update(logits=logits, penalties=penalties)
    names = ("logits", "penalties", "prompt_counts", "output_counts", "grammar_mask", "mask_rows")
    arguments = [inputs[name].to(DEVICE) for name in names]
    results = []
    for plain in (True, False):
        values = torch.empty(rows, vocab, dtype=torch.float64, device=DEVICE)
        tokens = greedy_tokens(*arguments, values, plain_f32=plain, splits=splits)
        results.append((tokens.cpu(), values.cpu()))
    (plain_tokens, plain_values), (wide_tokens, wide_values) = results
    assert torch.equal(plain_tokens, wide_tokens) and torch.equal(plain_tokens, reference_greedy(inputs))
    assert torch.equal(plain_values, wide_values)
    assert plain_tokens[0] == 10 and plain_tokens[4] == 1234


@pytest.mark.parametrize("tied", [(2049, 1), (4097, 2050, 9), (7, 2055, 4103), (4999,), (2048, 0)])
def test_float32_lanes_keep_the_lowest_id_of_a_tie(tied):
    """The float32 reduction keeps one best value and id per lane across blocks (BLOCK ids apart in
    one lane) and reduces the lanes once: ties within a lane, across lanes and across blocks go to
    the lowest id, with one split and with the default."""
    rows, vocab = 2, 5000
    inputs = sample_inputs(rows, vocab, 10)
    logits = torch.randn(rows, vocab) - 5.0
    logits[0, list(tied)] = 4.0
    logits[1, list(tied)] = float("inf")  # +inf is float32 max: still a tie
    inputs.update(logits=logits, mask_rows=torch.zeros(rows, dtype=torch.bool),
                  penalties=torch.tensor([[1.0, 0.0, 0.0]] * rows))
    expected = reference_greedy(inputs)
    assert expected.tolist() == [min(tied)] * rows
    names = ("logits", "penalties", "prompt_counts", "output_counts", "grammar_mask", "mask_rows")
    for splits in (1, None):
        assert torch.equal(greedy_tokens(*(inputs[n].to(DEVICE) for n in names), splits=splits).cpu(), expected)
