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

Whether a call qualifies is decided on the host from its [R] and [R, 3] parameters and mask words
compared as numpy views of the CPU tensors (a NaN temperature compares false, so it is greedy; a
NaN penalty differs from neutral, so it is penalised), the masks tested whole before any row is
singled out: a few array operations of about a microsecond each instead of torch calls and host
reads (which, inside a step whose weights have just streamed through the caches, cost several
microseconds each). Where no row is restricted, the argmax is taken over the logits themselves
and kept when every row's maximum is finite: torch's max propagates NaN and +inf, so a finite
maximum means the row holds neither and the NaN/inf replacement would change nothing.
"""

from __future__ import annotations

import numpy
import torch

from helios.abi.grammar import MASK_WORD_BITS, disallowed

_NEUTRAL = numpy.array([1.0, 0.0, 0.0], dtype=numpy.float32)  # repetition, presence, frequency: off
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
    if not masked:
        best, tokens = row_argmax(logits)  # NaN and +inf come first, so `best` holds them
        if numpy.isfinite(best).all():  # no row holds NaN or inf: nan_to_num would change nothing
            return tokens
    values = torch.nan_to_num(logits, nan=_NEG_INF, posinf=_F32_MAX, neginf=_NEG_INF)
    if masked:
        values = values.masked_fill(disallowed(grammar_mask, mask_rows, logits.shape[1]), _NEG_INF)
    best, tokens = row_argmax(values)  # no NaN left: the first maximal index, the lowest id on ties
    tokens.numpy()[~(best > _NEG_INF)] = NO_TOKEN
    return tokens


def row_argmax(logits: torch.Tensor) -> tuple[numpy.ndarray, torch.Tensor]:
    """(each row's maximum, int64 [R] its first index) of CPU float32 logits [R, V], through numpy:
    the first maximal index, or the first NaN (numpy orders NaN above every number), as ``max(dim=-1)``
    gives the first NaN or the first maximum. numpy's SIMD argmax takes a tenth of torch's
    single-threaded ``max(dim=-1)`` at 16 rows of 32,000-128,256 ids (26 against 257 us, 90 against
    1,019 us) and a third at 1,024 ids (4 against 12 us)."""
    values = logits.numpy()
    index = values.argmax(axis=-1)
    return values[numpy.arange(values.shape[0]), index], torch.from_numpy(index.astype(numpy.int64, copy=False))


def _decision(vocab_size: int, temperature: torch.Tensor, penalties: torch.Tensor, grammar_mask: torch.Tensor,
              mask_rows: torch.Tensor, rows: torch.Tensor | None) -> tuple[bool, bool]:
    """(some deciding row draws or is penalised, some deciding row's mask restricts): the [R]
    and [R, 3] parameters and the masks compared as numpy views of the CPU tensors (a microsecond
    an operation), the masks tested whole first (the usual call: every mask allows every token)."""
    chosen = None if rows is None else rows.numpy()
    special = (temperature.numpy() > 0) | (penalties.numpy() != _NEUTRAL).any(axis=-1)
    if (special if chosen is None else special & chosen).any():
        return True, False
    words = grammar_mask.numpy()
    full, rest = divmod(vocab_size, MASK_WORD_BITS)
    if rest == 0 and (words[:, :full] == -1).all():
        return False, False  # every mask allows every token
    allowed = (words[:, :full] == -1).all(axis=-1)
    if rest:
        valid = (1 << rest) - 1  # the low `rest` bits of the last word (rest < 32: a positive int32)
        allowed &= (words[:, full] & valid) == valid
    restricting = mask_rows.numpy() & ~allowed
    return False, bool((restricting if chosen is None else restricting & chosen).any())


def allows_every_token(grammar_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [R]: the row's mask words allow every id < V (bits past V are not looked at)."""
    full, rest = divmod(vocab_size, MASK_WORD_BITS)
    allowed = (grammar_mask[:, :full] == -1).all(dim=-1)
    if rest:
        valid = (1 << rest) - 1  # the low `rest` bits of the last word (rest < 32: a positive int32)
        allowed &= (grammar_mask[:, full] & valid) == valid
    return allowed
