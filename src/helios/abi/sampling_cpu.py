"""The CPU's greedy fast path of ``helios::sample`` (see `helios.abi.sampling` for the semantics).

When no row of a call draws (temperature > 0) and none is penalised (repetition 1, presence 0,
frequency 0), the reference pipeline reduces to: NaN -> -inf, +inf -> float32 max, -inf where a
masked row's grammar mask disallows the token, the argmax with the lowest id on ties, and
NO_TOKEN for a row with nothing above -inf. Widening float32 to float64 is exact and keeps the
order, and neutral penalties leave every value as it is (x / 1, x * 1 and x - 0 * c - 0 are x), so
the float32 argmax selects the reference's token bit for bit, without the [R, V] float64 copies,
penalty passes and row selection. The runtime's programs mask every row and hand unconstrained
rows an all-allowing mask: such rows are recognised from their mask words (a few ops on [R, V/32])
instead of unpacking V bits per row. Any other call returns None and takes the reference pipeline.

Whether a call qualifies is decided on the host through numpy views of its small [R] and [R, W]
arguments (the CPU path only): a dozen numpy operations on a few hundred bytes cost less than the
same number of torch dispatches and a stacked host read, and decide the same (NaN compares false
in both, so a NaN temperature is greedy and a NaN penalty is not neutral).
"""

from __future__ import annotations

import numpy as np
import torch

from helios.abi.grammar import MASK_WORD_BITS, disallowed

_NEUTRAL = np.array([1.0, 0.0, 0.0], dtype=np.float32)  # repetition, presence, frequency: off
_F32_MAX = torch.finfo(torch.float32).max
_NEG_INF = float("-inf")
NO_TOKEN = -1  # as `helios.abi.sampling.NO_TOKEN`


def greedy_tokens_cpu(logits: torch.Tensor, temperature: torch.Tensor, penalties: torch.Tensor,
                      grammar_mask: torch.Tensor, mask_rows: torch.Tensor,
                      rows: torch.Tensor | None = None) -> torch.Tensor | None:
    """int64 [R] greedy tokens of validated float32 logits [R, V] when no row draws and none is
    penalised (see the module docstring), else None. Masked rows whose mask allows every token
    (the runtime's unconstrained rows) are left as they are; others get -inf where disallowed.
    With `rows` (bool [R]) only those rows decide (and only their tokens are meaningful)."""
    if logits.device.type != "cpu":
        return None
    special, masked = _decision(logits.shape[1], temperature, penalties, grammar_mask, mask_rows, rows)
    if special:
        return None
    values = torch.nan_to_num(logits, nan=_NEG_INF, posinf=_F32_MAX, neginf=_NEG_INF)
    if masked:
        values = values.masked_fill(disallowed(grammar_mask, mask_rows, logits.shape[1]), _NEG_INF)
    best, tokens = values.max(dim=-1)  # the first maximal index: the lowest id on ties
    return torch.where(best > _NEG_INF, tokens, NO_TOKEN)


def _decision(vocab_size: int, temperature: torch.Tensor, penalties: torch.Tensor, grammar_mask: torch.Tensor,
              mask_rows: torch.Tensor, rows: torch.Tensor | None) -> tuple[bool, bool]:
    """(some deciding row draws or is penalised, some deciding row's mask restricts), read on the
    host through numpy views of the CPU arguments (see the module docstring). The usual call (no
    row draws or is penalised, every mask allows every token) is settled by whole-array tests
    before any row is singled out."""
    drawn, penalised = temperature.numpy() > 0, penalties.numpy() != _NEUTRAL
    chosen = rows.numpy() if rows is not None else None
    if drawn.any() or penalised.any():
        special = drawn | penalised.any(-1)
        if chosen is None or (special & chosen).any():
            return True, False
    words = grammar_mask.numpy()
    full = vocab_size // MASK_WORD_BITS
    if vocab_size % MASK_WORD_BITS == 0 and (words[:, :full] == -1).all():
        return False, False  # every mask allows every token
    restricting = mask_rows.numpy() & ~_allows_every_token_np(words, vocab_size)
    if chosen is not None:
        restricting = restricting & chosen
    return False, bool(restricting.any())


def _allows_every_token_np(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """`allows_every_token` on a numpy view of the mask words."""
    full, rest = divmod(vocab_size, MASK_WORD_BITS)
    allowed = (words[:, :full] == -1).all(axis=-1)
    if rest:
        valid = (1 << rest) - 1
        allowed &= (words[:, full] & valid) == valid
    return allowed


def allows_every_token(grammar_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [R]: the row's mask words allow every id < V (bits past V are not looked at)."""
    full, rest = divmod(vocab_size, MASK_WORD_BITS)
    allowed = (grammar_mask[:, :full] == -1).all(dim=-1)
    if rest:
        valid = (1 << rest) - 1  # the low `rest` bits of the last word (rest < 32: a positive int32)
        allowed &= (grammar_mask[:, full] & valid) == valid
    return allowed
