"""`helios.abi.sampling_rows.greedy_rows` and the greedy kernel reading counts through row slots.

Without CUDA the kernel runs under Triton's interpreter on CPU tensors (as in test_triton_sampling).
Expected tokens: the reference's greedy token of each row with the counts gathered at its slot
(``table[slots]``), and NO_TOKEN for rows whose slot is negative (padding rows).
"""

from __future__ import annotations

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi.registry import AbiArgumentError  # noqa: E402
from helios.abi.sampling import NO_TOKEN, DrawParams, sample_reference  # noqa: E402
from helios.abi.sampling_rows import greedy_rows, greedy_rows_biased  # noqa: E402
from helios.abi.triton_sampling import greedy_tokens  # noqa: E402
from support.abi_inputs import sample_inputs  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
NEUTRAL = torch.tensor([1.0, 0.0, 0.0])


def _slotted(rows: int, vocab: int, seed: int, slots: list[int], tables: int = 6) -> dict:
    """`sample_inputs` whose counts live in tables of `tables` slots, read at `slots` (-1: padding)."""
    inputs = sample_inputs(rows, vocab, seed)
    generator = torch.Generator().manual_seed(seed + 100)
    inputs["prompt_table"], inputs["output_table"] = (
        ((torch.rand(tables, vocab, generator=generator) < 0.05)
         * torch.randint(1, 4, (tables, vocab), generator=generator)).to(torch.int32) for _ in range(2))
    inputs["slots"] = torch.tensor(slots, dtype=torch.int64)
    return inputs


def _expected(inputs: dict) -> torch.Tensor:
    """The reference greedy token of every row, counts gathered at its (clamped) slot; -1 without one."""
    rows = inputs["slots"].clamp(min=0)
    zero = torch.zeros_like(inputs["temperature"])
    params = DrawParams(inputs["seeds"], inputs["counters"], zero, inputs["top_k"], inputs["top_p"], inputs["min_p"])
    tokens = sample_reference(inputs["logits"], params, inputs["penalties"],
                              (inputs["prompt_table"][rows], inputs["output_table"][rows]),
                              inputs["grammar_mask"], inputs["mask_rows"])
    return torch.where(inputs["slots"] >= 0, tokens, NO_TOKEN)


def _arguments(inputs: dict, device: str = DEVICE) -> list[torch.Tensor]:
    names = ("logits", "penalties", "prompt_table", "output_table", "slots", "grammar_mask", "mask_rows")
    return [inputs[name].to(device) for name in names]


@pytest.mark.parametrize("rows, vocab, seed, slots", [
    (7, 4099, 0, [3, 0, 5, 1, -1, 2, -1]),  # padding rows among live ones, slots out of order
    (4, 300, 1, [2, 2, -1, -1]),  # two rows of one slot; the tail padded
    (1, 6000, 2, [4]),
])
def test_the_kernel_reads_counts_at_each_rows_slot(rows, vocab, seed, slots):
    inputs = _slotted(rows, vocab, seed, slots)
    expected = _expected(inputs)
    logits, penalties, prompt, output, row_slots, mask, mask_rows = _arguments(inputs)
    got = greedy_tokens(logits, penalties, prompt, output, mask, mask_rows, row_slots=row_slots).cpu()
    assert torch.equal(got, expected)
    assert all(token == NO_TOKEN for token, slot in zip(got.tolist(), slots) if slot < 0)


def test_penalised_rows_see_their_own_slots_counts():
    """Two rows with the same logits and penalties, different slots: the slot's counts decide."""
    inputs = _slotted(2, 300, 4, [1, 0], tables=2)
    logits = torch.zeros(2, 300)
    logits[:, 10], logits[:, 20] = 3.0, 2.0
    table = torch.zeros(2, 300, dtype=torch.int32)
    table[1, 10] = 3  # slot 1 generated id 10: penalised below id 20
    inputs.update(logits=logits, prompt_table=torch.zeros_like(table), output_table=table,
                  mask_rows=torch.zeros(2, dtype=torch.bool), penalties=torch.tensor([[2.0, 0.5, 0.1]] * 2))
    assert _expected(inputs).tolist() == [20, 10]
    logits, penalties, prompt, output, row_slots, mask, mask_rows = _arguments(inputs)
    assert greedy_tokens(logits, penalties, prompt, output, mask, mask_rows, row_slots=row_slots).tolist() == [20, 10]


def test_padding_rows_with_zero_parameters_get_no_token_and_live_rows_the_reference():
    """Rows past the live ones carry zero sampling parameters (repetition 0: not neutral) and
    slot -1; live rows are neutral."""
    inputs = _slotted(6, 5000, 9, [0, 1, 2, -1, -1, -1], tables=3)
    penalties = NEUTRAL.repeat(6, 1)
    penalties[3:] = 0.0
    inputs.update(penalties=penalties)
    expected = _expected(inputs)
    assert expected.tolist()[3:] == [NO_TOKEN] * 3 and all(t >= 0 for t in expected.tolist()[:3])
    assert torch.equal(greedy_rows(*_arguments(inputs)).cpu(), expected)


@pytest.mark.parametrize("rows, vocab, seed, slots", [(5, 700, 7, [0, -1, 4, 1, -1]), (3, 50, 3, [2, 1, 0])])
def test_greedy_rows_on_the_cpu_gives_the_reference_tokens(rows, vocab, seed, slots):
    inputs = _slotted(rows, vocab, seed, slots)
    assert torch.equal(greedy_rows(*_arguments(inputs, "cpu")), _expected(inputs))


def test_the_kernel_refuses_row_slots_with_stored_values():
    inputs = _slotted(2, 300, 5, [0, 1])
    logits, penalties, prompt, output, row_slots, mask, mask_rows = _arguments(inputs)
    values = torch.empty(2, 300, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="exclude values_out"):
        greedy_tokens(logits, penalties, prompt, output, mask, mask_rows, values, row_slots=row_slots)


def _biased(inputs: dict, dtype: torch.dtype, width: int = 7) -> dict:
    """`inputs` with the logits as a `dtype` product and a logit bias per row: ids -1 padded, id 0
    among them (padding clamps to it too), biases that win, lose and ban (-inf), one row unbiased."""
    rows, vocab = inputs["logits"].shape
    generator = torch.Generator().manual_seed(rows * vocab)
    product = inputs["logits"].to(dtype)
    ids = torch.full((rows, width), -1, dtype=torch.int64)
    values = torch.zeros(rows, width)
    for row in range(rows - 1):  # the last row has no bias
        chosen = torch.randperm(vocab, generator=generator)[: 1 + row % (width - 1)]
        if row % 3 == 0:
            chosen[0] = 0
        ids[row, : len(chosen)] = chosen
        values[row, : len(chosen)] = torch.randn(len(chosen), generator=generator) * 30
        top = int(product[row].float().nan_to_num(nan=float("-inf")).argmax())
        if row % 2 and top not in chosen.tolist() and len(chosen) < width:  # ban the unbiased winner
            ids[row, len(chosen)], values[row, len(chosen)] = top, float("-inf")
    values[ids < 0] = torch.randn(int((ids < 0).sum()), generator=generator)  # padding values are ignored
    return dict(inputs, product=product, bias_ids=ids, bias_values=values)


def _widened_biased(inputs: dict) -> dict:
    """The float32 logits a program samples: the product widened, the bias scatter-added."""
    ids, values = inputs["bias_ids"], inputs["bias_values"]
    logits = inputs["product"].float().scatter_add(1, ids.clamp(min=0), torch.where(ids >= 0, values, 0.0))
    return dict(inputs, logits=logits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows, vocab, seed, slots", [
    (7, 4099, 0, [3, 0, 5, 1, -1, 2, -1]),
    (4, 300, 1, [2, 2, -1, 0]),
    (1, 6000, 2, [4]),
])
def test_biased_rows_give_the_tokens_of_the_widened_biased_logits(dtype, rows, vocab, seed, slots):
    """The kernel reading the 16-bit product and adding the bias in its combine gives every row the
    reference's token for the float32 widened, biased logits; the product ends as it began."""
    inputs = _biased(_slotted(rows, vocab, seed, slots), dtype)
    expected = _expected(_widened_biased(inputs))
    product = inputs["product"].to(DEVICE)
    assert torch.equal(_kernel_biased(inputs, product), expected)
    bits = torch.int16 if dtype != torch.float32 else torch.int32
    assert torch.equal(product.cpu().view(bits), inputs["product"].view(bits))  # put back bit for bit
    assert torch.equal(greedy_rows_biased(*(inputs[name] for name in _BIASED)), expected)  # the host path


_BIASED = ("product", "bias_ids", "bias_values", "penalties", "prompt_table", "output_table", "slots",
           "grammar_mask", "mask_rows")


def _kernel_biased(inputs: dict, product: torch.Tensor) -> torch.Tensor:
    """The kernel's tokens (`greedy_rows_biased` on CUDA; here under the interpreter on the CPU too)."""
    penalties, prompt, output, slots, mask, mask_rows, ids, values = (
        inputs[name].to(DEVICE) for name in ("penalties", "prompt_table", "output_table", "slots", "grammar_mask",
                                             "mask_rows", "bias_ids", "bias_values"))
    return greedy_tokens(product, penalties, prompt, output, mask, mask_rows, row_slots=slots,
                         bias=(ids, values)).cpu()


def test_a_bias_decides_ties_and_bans_by_the_float32_sum():
    """Ties between a biased id and an unbiased one go to the lower id; a biased id whose float32 sum
    is below the unbiased maximum loses; a ban (-inf) removes the winner; a row whose every id is
    banned or -inf gets no token."""
    vocab = 2100
    inputs = _slotted(4, vocab, 11, [0, 1, 2, 3], tables=4)
    product = torch.full((4, vocab), -2.0, dtype=torch.bfloat16)
    product[:, 2050] = 1.0  # the unbiased maximum, in the second block
    product[0, 7] = 0.5  # + 0.5: ties with id 2050, and is lower
    product[1, 2099] = 0.5  # + 0.5: ties with id 2050, and is higher
    product[2, 30] = 3.0  # the row's winner, banned
    product[3] = float("-inf")
    ids = torch.tensor([[7, -1], [2099, -1], [30, 2050], [5, -1]])
    values = torch.tensor([[0.5, 0.0], [0.5, 0.0], [float("-inf"), -0.5], [float("-inf"), 0.0]])
    neutral = NEUTRAL.repeat(4, 1)
    inputs.update(logits=product, product=product, bias_ids=ids, bias_values=values, penalties=neutral,
                  mask_rows=torch.zeros(4, dtype=torch.bool))
    expected = _expected(_widened_biased(inputs))
    assert expected.tolist() == [7, 2050, 2050, NO_TOKEN]  # row 2: its winner banned, 2050 still leads at 0.5
    assert _kernel_biased(inputs, product.to(DEVICE)).tolist() == expected.tolist()
    assert greedy_rows_biased(*(inputs[name] for name in _BIASED)).tolist() == expected.tolist()


@pytest.mark.parametrize("change, message", [
    (lambda a: a.__setitem__(0, a[0].double()), "logits must be bfloat16 or float16 or float32"),
    (lambda a: a.__setitem__(1, a[1].float()), "bias_ids must be"),
    (lambda a: a.__setitem__(1, a[1][:1]), "bias_ids must be"),
    (lambda a: a.__setitem__(2, a[2].double()), "bias_values"),
    (lambda a: a.__setitem__(2, a[2][:, :1]), "bias_values"),
    (lambda a: a.__setitem__(6, a[6].float()), "slots must be"),
])
def test_bad_biased_arguments_raise_a_typed_error(change, message):
    inputs = _biased(_slotted(3, 100, 6, [0, 1, -1]), torch.bfloat16)
    arguments = [inputs[name] for name in _BIASED]
    change(arguments)
    with pytest.raises(AbiArgumentError, match=message):
        greedy_rows_biased(*arguments)


@pytest.mark.parametrize("change, message", [
    (lambda a: a.__setitem__(0, a[0].double()), "logits must be float32"),
    (lambda a: a.__setitem__(2, a[2].long()), "prompt_table"),
    (lambda a: a.__setitem__(3, a[3][:, :10]), "output_table"),
    (lambda a: a.__setitem__(4, a[4].float()), "slots must be"),
    (lambda a: a.__setitem__(4, a[4][:1]), "slots must be"),
    (lambda a: a.__setitem__(1, a[1][:, :2]), "penalties"),
    (lambda a: a.__setitem__(5, a[5][:, :1]), "grammar_mask"),
])
def test_bad_arguments_raise_a_typed_error(change, message):
    arguments = _arguments(_slotted(3, 100, 6, [0, 1, -1]), "cpu")
    change(arguments)
    with pytest.raises(AbiArgumentError, match=message):
        greedy_rows(*arguments)
