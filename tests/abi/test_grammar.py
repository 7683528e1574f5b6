"""Grammar mask bit layout and ``helios::apply_grammar_mask``."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from helios.abi import grammar
from helios.abi.program_image import decode_program, encode_program
from helios.abi.registry import AbiArgumentError

NEG_INF = float("-inf")


def random_mask(num_rows: int, vocab_size: int, seed: int) -> torch.Tensor:
    """int32 words with every bit pattern, the sign bit included."""
    generator = np.random.default_rng(seed)
    words = generator.integers(0, 2**32, size=(num_rows, grammar.mask_words(vocab_size)))
    return torch.from_numpy(words.astype(np.uint32).view(np.int32).copy())


def reference_allowed(mask: torch.Tensor, vocab_size: int) -> np.ndarray:
    words = mask.numpy().view(np.uint32)
    allowed = np.zeros((mask.shape[0], vocab_size), dtype=bool)
    for row in range(mask.shape[0]):
        for token in range(vocab_size):
            allowed[row, token] = (int(words[row, token // 32]) >> (token % 32)) & 1 == 1
    return allowed


def mask_allowing(num_rows: int, vocab_size: int, tokens: list[int]) -> torch.Tensor:
    words = np.zeros((num_rows, grammar.mask_words(vocab_size)), dtype=np.uint32)
    for token in tokens:
        words[:, token // 32] |= np.uint32(1 << (token % 32))
    return torch.from_numpy(words.view(np.int32).copy())


def export_roundtrip(module: torch.nn.Module, args: tuple) -> torch.nn.Module:
    program = torch.export.export(module, args, strict=False)
    return decode_program(encode_program(program)).module()  # stored as a program image


@pytest.mark.parametrize("vocab_size", [1, 31, 32, 33, 64, 70, 100])
def test_unpack_matches_bit_reference(vocab_size):
    mask = random_mask(5, vocab_size, seed=vocab_size)
    unpacked = grammar.unpack_mask(mask, vocab_size)
    assert unpacked.dtype == torch.bool and unpacked.shape == (5, vocab_size)
    assert np.array_equal(unpacked.numpy(), reference_allowed(mask, vocab_size))


def test_bit_j_of_word_w_allows_token_32w_plus_j():
    for token in (0, 1, 31, 32, 63, 64, 69):
        allowed = grammar.unpack_mask(mask_allowing(1, 70, [token]), 70)[0]
        assert allowed.nonzero().flatten().tolist() == [token]


def test_apply_sets_disallowed_to_neg_inf_in_masked_rows_only():
    vocab_size = 70
    logits = torch.randn(4, vocab_size)
    logits[3, 5] = float("nan")
    mask = random_mask(4, vocab_size, seed=1)
    mask_rows = torch.tensor([True, False, True, False])
    out = torch.ops.helios.apply_grammar_mask(logits, mask, mask_rows)
    allowed = reference_allowed(mask, vocab_size)
    for row in (0, 2):
        expected = np.where(allowed[row], logits[row].numpy(), NEG_INF)
        assert np.array_equal(out[row].numpy(), expected)
    assert torch.equal(out[1], logits[1])
    assert torch.isnan(out[3, 5]) and torch.equal(out[3, :5], logits[3, :5])


def test_apply_does_not_mutate_and_returns_contiguous():
    logits = torch.randn(8, 3).t()  # [3, 8], not contiguous
    before = logits.clone()
    out = torch.ops.helios.apply_grammar_mask(
        logits, mask_allowing(3, 8, [1]), torch.ones(3, dtype=torch.bool))
    assert torch.equal(logits, before)
    assert out.is_contiguous()
    assert torch.isinf(out[:, [0, *range(2, 8)]]).all() and torch.equal(out[:, 1], logits[:, 1])


def test_bits_beyond_vocabulary_are_ignored():
    vocab_size = 40  # two words; bits 8..31 of word 1 lie beyond the vocabulary
    mask = mask_allowing(1, 64, [3, 45, 63])
    out = torch.ops.helios.apply_grammar_mask(
        torch.zeros(1, vocab_size), mask, torch.ones(1, dtype=torch.bool))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [3]


def test_row_with_no_allowed_token_becomes_all_neg_inf():
    logits = torch.randn(2, 50)
    mask = mask_allowing(2, 50, [])
    mask[1] = -1  # every bit set
    out = torch.ops.helios.apply_grammar_mask(logits, mask, torch.ones(2, dtype=torch.bool))
    assert torch.equal(out[0], torch.full((50,), NEG_INF))
    assert torch.equal(out[1], logits[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_keeps_logit_dtype(dtype):
    logits = torch.randn(2, 33).to(dtype)
    out = torch.ops.helios.apply_grammar_mask(
        logits, mask_allowing(2, 33, [32]), torch.tensor([True, False]))
    assert out.dtype == dtype
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [32]
    assert torch.equal(out[1], logits[1])


@pytest.mark.parametrize("change,message", [
    (dict(grammar_mask=torch.zeros(2, 3, dtype=torch.int32)), r"grammar_mask must be torch.int32 \[2, 2\]"),
    (dict(grammar_mask=torch.zeros(2, 2, dtype=torch.int64)), "grammar_mask must be torch.int32"),
    (dict(grammar_mask=torch.zeros(3, 2, dtype=torch.int32)), "grammar_mask must be"),
    (dict(mask_rows=torch.zeros(2, dtype=torch.int32)), "mask_rows must be torch.bool"),
    (dict(mask_rows=torch.zeros(3, dtype=torch.bool)), r"mask_rows must be torch.bool \[2\]"),
    (dict(logits=torch.zeros(40)), "logits must be a 2-D Tensor"),
    (dict(logits=torch.zeros(2, 40, dtype=torch.float64)), "float32, float16 or bfloat16"),
    (dict(logits=torch.zeros(2, 0)), "at least one vocabulary column"),
    (dict(mask_rows=torch.zeros(2, dtype=torch.bool, device="meta")), "one device"),
])
def test_argument_errors_name_the_problem(change, message):
    args = dict(logits=torch.zeros(2, 40), grammar_mask=torch.zeros(2, 2, dtype=torch.int32),
                mask_rows=torch.zeros(2, dtype=torch.bool))
    args.update(change)
    with pytest.raises(AbiArgumentError, match=message):
        torch.ops.helios.apply_grammar_mask(**args)


class _MaskModule(torch.nn.Module):
    def forward(self, logits, grammar_mask, mask_rows):
        return torch.ops.helios.apply_grammar_mask(logits * 2.0, grammar_mask, mask_rows)


def test_op_survives_export_save_and_load():
    args = (torch.randn(3, 45), random_mask(3, 45, seed=9), torch.tensor([True, False, True]))
    loaded = export_roundtrip(_MaskModule(), args)
    assert torch.equal(loaded(*args), _MaskModule()(*args))
    other = (torch.randn(3, 45), random_mask(3, 45, seed=10), torch.tensor([False, True, True]))
    assert torch.equal(loaded(*other), _MaskModule()(*other))


def test_export_reports_argument_errors():
    args = (torch.randn(3, 45), torch.zeros(3, 1, dtype=torch.int32), torch.ones(3, dtype=torch.bool))
    with pytest.raises(AbiArgumentError, match="grammar_mask"):
        torch.export.export(_MaskModule(), args, strict=False)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    args = (torch.randn(6, 77), random_mask(6, 77, seed=4), torch.tensor([1, 0, 1, 1, 0, 1]).bool())
    expected = torch.ops.helios.apply_grammar_mask(*args)
    on_cuda = torch.ops.helios.apply_grammar_mask(*(a.cuda() for a in args))
    assert torch.equal(on_cuda.cpu(), expected)
