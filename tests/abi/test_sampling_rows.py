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
from helios.abi.sampling_rows import greedy_rows  # noqa: E402
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
    with pytest.raises(ValueError, match="exclude"):
        greedy_tokens(logits, penalties, prompt, output, mask, mask_rows, values, row_slots=row_slots)


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
