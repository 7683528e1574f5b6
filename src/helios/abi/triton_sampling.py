"""Triton kernels of ``helios::sample``'s greedy path (CUDA; CPU under TRITON_INTERPRET=1).

`greedy_tokens` computes, for every row, exactly the token that `helios.abi.sampling`'s reference
pipeline selects when the row does not draw (steps 1-5 of its docstring): the float64 argmax,
lowest id on ties, after sanitising, penalties and the grammar mask, or NO_TOKEN (-1) for a row
with no token above -inf. It reads each row's logits once and, unlike the reference, touches
prompt/output counts only in rows whose penalties are not neutral (repetition 1, presence 0,
frequency 0) and mask words only in rows whose ``mask_rows`` entry is true: those per-row
decisions are made on the device, so nothing synchronises and a CUDA graph holds the launches.

Why the result is the reference's bit for bit: float32 -> float64 is exact; in a row with neutral
penalties the reference's penalty step is the identity (x / 1, x * 1, x - 0 * c - 0); the penalty
arithmetic of other rows is the reference's float64 arithmetic in the same order; the argmax
compares the same float64 values and keeps the lowest id on ties.

With `values_out` the same pass also stores those float64 values (the input of the random draw,
steps 6-8), so the drawing path skips the reference's dozen [R, V] float64 passes before its sort.

A row with neutral penalties is reduced in float32 (`_plain_best`: the same values, order, ties and
stored values as float64, which only the penalty arithmetic needs; the float64 max and argmax made
the pass compute-bound, 0.5 ms for 256 rows of 128,256 ids on an H200), keeping a best value and id
per lane and reducing the lanes once at the end (0.081 -> 0.059 ms at 256 rows).

With `row_slots` the counts are per-slot tables read at each row's slot, and a row without a slot
(padding) reads nothing (`helios.abi.sampling_rows.greedy_rows`, bound into greedy graphs).

Two kernels: each (row, split) program reduces a contiguous id range of one row to its best
(value, id); a combine program per row picks the first split holding the row maximum (splits are in
id order, so that is the lowest id). The split count depends only on the static row count and
vocabulary size, so enough programs run at batch 1 to use the device's bandwidth.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["greedy_tokens", "greedy_splits"]

BLOCK = 2048  # ids per loop iteration of one program
_TARGET_PROGRAMS = 512  # enough (row, split) programs to keep every SM of a large GPU reading
_MAX_SPLITS = 64


def greedy_splits(num_rows: int, vocab_size: int) -> int:
    """Splits of one row's ids: a power of two, at most one per BLOCK ids (static: shapes only)."""
    wanted = max(1, min(_MAX_SPLITS, -(-_TARGET_PROGRAMS // max(num_rows, 1)), -(-vocab_size // BLOCK)))
    return triton.next_power_of_2(wanted)


@triton.jit
def _greedy_partial_kernel(
    logits, logit_stride, penalties, prompt_counts, prompt_stride, output_counts, output_stride,
    grammar_mask, mask_stride, mask_rows, part_values, part_ids, values_out, vocab_size, chunk, row_slots,
    NUM_SPLITS: tl.constexpr, BLOCK_V: tl.constexpr, STORE_VALUES: tl.constexpr, PLAIN_F32: tl.constexpr,
    ROW_SLOTS: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    repetition, presence, frequency, penalised = _row_penalties(penalties, row)
    factors = (repetition, presence, frequency)
    masked = tl.load(mask_rows + row).to(tl.int32) != 0
    start = split * chunk
    end = tl.minimum(start + chunk, vocab_size)
    logits_row = logits + row.to(tl.int64) * logit_stride
    mask_row = grammar_mask + row.to(tl.int64) * mask_stride
    values_row = values_out + row.to(tl.int64) * vocab_size
    if ROW_SLOTS:  # counts are tables read at the row's slot; a negative slot (padding) reads nothing
        slot = tl.load(row_slots + row).to(tl.int64)
        table_row = tl.maximum(slot, 0)
        end = tl.where(slot >= 0, end, start)  # an empty range: (-inf, start), NO_TOKEN after the combine
    else:
        table_row = row.to(tl.int64)
    counts = (prompt_counts + table_row * prompt_stride, output_counts + table_row * output_stride)
    if PLAIN_F32:
        if penalised:
            best, best_id = _float64_best(logits_row, counts, mask_row, values_row, start, end, penalised, masked,
                                          factors, BLOCK_V, STORE_VALUES)
        else:
            best, best_id = _plain_best(logits_row, mask_row, values_row, start, end, masked, BLOCK_V,
                                        STORE_VALUES)
    else:
        best, best_id = _float64_best(logits_row, counts, mask_row, values_row, start, end, penalised, masked,
                                      factors, BLOCK_V, STORE_VALUES)
    tl.store(part_values + row * NUM_SPLITS + split, best)
    tl.store(part_ids + row * NUM_SPLITS + split, best_id)


@triton.jit
def _row_penalties(penalties, row):
    """`row`'s repetition, presence and frequency penalties in float64, and whether they are not neutral."""
    repetition = tl.load(penalties + row * 3).to(tl.float64)
    presence = tl.load(penalties + row * 3 + 1).to(tl.float64)
    frequency = tl.load(penalties + row * 3 + 2).to(tl.float64)
    return repetition, presence, frequency, (repetition != 1.0) | (presence != 0.0) | (frequency != 0.0)


@triton.jit
def _float64_best(logits_row, counts, mask_row, values_row, start, end, penalised, masked, factors,
                  BLOCK_V: tl.constexpr, STORE_VALUES: tl.constexpr):
    """(best float64 value, its lowest id) of ids [start, end) of one row, steps 1-4 in float64."""
    best = tl.full((), float("-inf"), tl.float64)
    best_id = start.to(tl.int64)
    for offset in range(start, end, BLOCK_V):
        ids = offset + tl.arange(0, BLOCK_V)
        inside = ids < end
        x = tl.load(logits_row + ids, mask=inside, other=float("-inf")).to(tl.float32).to(tl.float64)
        x = _float64_values(x, ids, inside, counts, mask_row, penalised, masked, factors)
        if STORE_VALUES:  # the float64 values the random draw starts from
            tl.store(values_row + ids, x, mask=inside)
        x = tl.where(inside, x, float("-inf"))
        block_best = tl.max(x, axis=0)
        block_id = tl.argmax(x, axis=0, tie_break_left=True).to(tl.int64) + offset
        better = block_best > best  # strictly: an earlier block keeps a tie
        best_id = tl.where(better, block_id, best_id)
        best = tl.where(better, block_best, best)
    return best, best_id


@triton.jit
def _float64_values(x, ids, inside, counts, mask_row, penalised, masked, factors):
    """Steps 1-4 of the reference on float64 values `x` of ids `ids` (`inside`: the ids to read)."""
    repetition, presence, frequency = factors
    x = tl.where(x != x, float("-inf"), x)  # step 1: NaN -> -inf, +inf -> float32 max
    x = tl.where(x == float("inf"), 3.4028234663852886e38, x)
    if penalised:  # step 2, in the reference's float64 order
        prompt = tl.load(counts[0] + ids, mask=inside, other=0)
        output = tl.load(counts[1] + ids, mask=inside, other=0)
        generated = output > 0
        seen = generated | (prompt > 0)
        repeated = tl.where(x > 0, x / repetition, x * repetition)
        x = tl.where(seen, repeated, x)
        x = tl.where(generated, x - frequency * output.to(tl.float64) - presence, x)
    if masked:  # step 3
        x = _masked(x, ids, inside, mask_row)
    x = tl.where(x != x, float("-inf"), x)  # step 4
    return tl.where(x == float("inf"), 1.7976931348623157e308, x)


@triton.jit
def _masked(x, ids, inside, mask_row):
    """`x` with -inf where the row's grammar mask words disallow the id (step 3)."""
    word = tl.load(mask_row + ids // 32, mask=inside, other=0)
    return tl.where(((word >> (ids % 32)) & 1) != 0, x, float("-inf"))


@triton.jit
def _float32_values(x, ids, inside, mask_row, masked):
    """Steps 1-4 of a row with neutral penalties on float32 values (see `_plain_best`)."""
    x = tl.where(x != x, float("-inf"), x)  # step 1
    x = tl.where(x == float("inf"), 3.4028234663852886e38, x)
    if masked:  # step 3
        x = _masked(x, ids, inside, mask_row)
    return x


@triton.jit
def _plain_best(logits_row, mask_row, values_row, start, end, masked, BLOCK_V: tl.constexpr,
                STORE_VALUES: tl.constexpr):
    """`_float64_best` of a row with neutral penalties, in float32: without the penalty arithmetic,
    steps 1-4 only sanitise and mask float32 values (exact in float32; step 4 then changes nothing),
    and float32 -> float64 is exact and keeps the order, so the argmax, its ties and the stored values
    are the float64 path's, at float32 reduction cost.

    Each lane keeps its own best value and the first id holding it (ids grow along a lane; a later
    equal value does not replace it), and the lanes are reduced once, at the end: the largest value,
    then the lowest id among the lanes holding it - the block-by-block argmax's result without its
    two block reductions per iteration."""
    lane_best = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    lane_id = tl.zeros((BLOCK_V,), tl.int32)
    for offset in range(start, end, BLOCK_V):
        ids = offset + tl.arange(0, BLOCK_V)
        inside = ids < end
        x = tl.load(logits_row + ids, mask=inside, other=float("-inf")).to(tl.float32)
        x = _float32_values(x, ids, inside, mask_row, masked)
        if STORE_VALUES:
            tl.store(values_row + ids, x.to(tl.float64), mask=inside)
        x = tl.where(inside, x, float("-inf"))
        better = x > lane_best
        lane_id = tl.where(better, ids, lane_id)
        lane_best = tl.where(better, x, lane_best)
    best = tl.max(lane_best, axis=0)
    best_id = tl.min(tl.where(lane_best == best, lane_id, 2147483647), axis=0)
    best_id = tl.where(best > float("-inf"), best_id, start)  # nothing above -inf: as `_float64_best`
    return best.to(tl.float64), best_id.to(tl.int64)


@triton.jit
def _greedy_combine_kernel(part_values, part_ids, tokens, NUM_SPLITS: tl.constexpr):
    row = tl.program_id(0)
    splits = tl.arange(0, NUM_SPLITS)
    values = tl.load(part_values + row * NUM_SPLITS + splits)
    first = tl.argmax(values, axis=0, tie_break_left=True)
    best = tl.max(values, axis=0)
    token = tl.load(part_ids + row * NUM_SPLITS + first)
    tl.store(tokens + row, tl.where(best > float("-inf"), token, -1))


@triton.jit
def _bias_set_aside_kernel(logits, logit_stride, bias_ids, ids_stride, saved, vocab_size, num_bias,
                           BLOCK_B: tl.constexpr):
    """Row r's biased ids: their logits copied to ``saved[r]``, then -inf in the logits (the
    partial pass then reduces only the unbiased ids; `_biased_combine_kernel` puts them back)."""
    row = tl.program_id(0)
    entries = tl.arange(0, BLOCK_B)
    ids = tl.load(bias_ids + row * ids_stride + entries, mask=entries < num_bias, other=-1).to(tl.int64)
    real = (ids >= 0) & (ids < vocab_size)
    logits_row = logits + row.to(tl.int64) * logit_stride
    raw = tl.load(logits_row + ids, mask=real, other=0.0)
    tl.store(saved + row * BLOCK_B + entries, raw, mask=real)
    tl.store(logits_row + ids, tl.full((BLOCK_B,), float("-inf"), tl.float32), mask=real)  # cast on store


@triton.jit
def _biased_combine_kernel(part_values, part_ids, tokens, logits, logit_stride, bias_ids, ids_stride, bias_values,
                           values_stride, saved, vocab_size, num_bias, penalties, prompt_counts, prompt_stride,
                           output_counts, output_stride, grammar_mask, mask_stride, mask_rows, row_slots,
                           NUM_SPLITS: tl.constexpr, BLOCK_B: tl.constexpr, ROW_SLOTS: tl.constexpr):
    """`_greedy_combine_kernel` over the splits and the row's biased ids: each of those takes its
    float32 logit plus its bias (the program's ``scatter_add``), steps 1-4 as in the partial pass,
    and competes with the splits' best (the lowest id on a tie); the set-aside logits go back."""
    row = tl.program_id(0)
    splits = tl.arange(0, NUM_SPLITS)
    values = tl.load(part_values + row * NUM_SPLITS + splits)
    best = tl.max(values, axis=0)
    token = tl.load(part_ids + row * NUM_SPLITS + tl.argmax(values, axis=0, tie_break_left=True))
    entries = tl.arange(0, BLOCK_B)
    ids = tl.load(bias_ids + row * ids_stride + entries, mask=entries < num_bias, other=-1).to(tl.int64)
    real = (ids >= 0) & (ids < vocab_size)
    raw = tl.load(saved + row * BLOCK_B + entries, mask=real, other=0.0)
    tl.store(logits + row.to(tl.int64) * logit_stride + ids, raw, mask=real)
    live = real
    if ROW_SLOTS:  # a padding row (negative slot) samples nothing: its splits are empty, its bias ignored
        slot = tl.load(row_slots + row).to(tl.int64)
        table_row = tl.maximum(slot, 0)
        live = real & (slot >= 0)
    else:
        table_row = row.to(tl.int64)
    x = raw.to(tl.float32) + tl.load(bias_values + row * values_stride + entries, mask=real, other=0.0)
    repetition, presence, frequency, penalised = _row_penalties(penalties, row)
    factors = (repetition, presence, frequency)
    masked = tl.load(mask_rows + row).to(tl.int32) != 0
    mask_row = grammar_mask + row.to(tl.int64) * mask_stride
    if penalised:
        counts = (prompt_counts + table_row * prompt_stride, output_counts + table_row * output_stride)
        wide = _float64_values(x.to(tl.float64), ids, live, counts, mask_row, penalised, masked, factors)
    else:
        wide = _float32_values(x, ids, live, mask_row, masked).to(tl.float64)
    wide = tl.where(live, wide, float("-inf"))
    biased_best = tl.max(wide, axis=0)
    biased_token = tl.min(tl.where(live & (wide == biased_best), ids, vocab_size), axis=0)
    token = tl.where(biased_best > best, biased_token,
                     tl.where(biased_best == best, tl.minimum(token, biased_token), token))
    best = tl.maximum(best, biased_best)
    tl.store(tokens + row, tl.where(best > float("-inf"), token, -1))


def greedy_tokens(logits: torch.Tensor, penalties: torch.Tensor, prompt_counts: torch.Tensor,
                  output_counts: torch.Tensor, grammar_mask: torch.Tensor,
                  mask_rows: torch.Tensor, values_out: torch.Tensor | None = None, *,
                  plain_f32: bool = True, splits: int | None = None,
                  row_slots: torch.Tensor | None = None,
                  bias: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """int64 [R]: each row's greedy token as `sample_reference` selects it for a non-drawing row.

    Inputs are validated ``helios::sample`` arguments (logits float32 [R, V]). With `values_out`
    (float64 [R, V], contiguous) the kernel also stores every row's values after steps 1-4, exactly
    the reference's, for the random draw. Allocates its output and two small partial buffers;
    never reads device data on the host. `plain_f32` False and `splits` (a power of two) are for A/B
    benchmarks: the float64 reduction in every row, another split count.

    With `row_slots` (integer [R]) the counts are tables [S, V] and row r reads row
    ``row_slots[r]`` of them (the values ``table[row_slots]`` would hold, without gathering [R, V]
    of them, and only in penalised rows); a row whose slot is negative reads nothing and gets
    NO_TOKEN (-1).

    With `bias` (ids integer [R, B], -1 padding, distinct in a row; values float32 [R, B]) the tokens
    are those of the float32 logits with each row's bias added (``logits.float().scatter_add(1, ids,
    values)`` over its ids >= 0), and `logits` may hold bfloat16 or float16 values (their float32
    widening is exact): the biased ids' logits are set aside and -inf while the splits are reduced,
    then each competes with its bias in the combine and is put back, so `logits` ends as it began.
    Neither `row_slots` nor `bias` with `values_out`.
    """
    if values_out is not None and (row_slots is not None or bias is not None):
        raise ValueError("greedy_tokens: row_slots and bias exclude values_out")
    num_rows, vocab_size = logits.shape
    splits = splits or greedy_splits(num_rows, vocab_size)
    chunk = -(-vocab_size // splits)
    tokens = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return tokens
    part_values = torch.empty((num_rows, splits), dtype=torch.float64, device=logits.device)
    part_ids = torch.empty((num_rows, splits), dtype=torch.int64, device=logits.device)
    operands = [_last_contiguous(t) for t in (logits, penalties, prompt_counts, output_counts, grammar_mask)]
    logits, penalties, prompt_counts, output_counts, grammar_mask = operands
    penalties, mask_rows = penalties.contiguous(), mask_rows.contiguous()
    slots = part_ids if row_slots is None else row_slots.contiguous()
    if bias is not None:
        bias_ids, bias_values = (_last_contiguous(t) for t in bias)
        num_bias = bias_ids.shape[1]
        block_b = triton.next_power_of_2(max(num_bias, 1))
        saved = torch.empty((num_rows, block_b), dtype=logits.dtype, device=logits.device)
        _bias_set_aside_kernel[(num_rows,)](logits, logits.stride(0), bias_ids, bias_ids.stride(0), saved, vocab_size,
                                            num_bias, BLOCK_B=block_b)
    _greedy_partial_kernel[(num_rows, splits)](
        logits, logits.stride(0), penalties, prompt_counts, prompt_counts.stride(0), output_counts,
        output_counts.stride(0), grammar_mask, grammar_mask.stride(0), mask_rows,
        part_values, part_ids, part_values if values_out is None else values_out, vocab_size, chunk, slots,
        NUM_SPLITS=splits, BLOCK_V=BLOCK, STORE_VALUES=values_out is not None, PLAIN_F32=plain_f32,
        ROW_SLOTS=row_slots is not None,
    )
    if bias is None:
        _greedy_combine_kernel[(num_rows,)](part_values, part_ids, tokens, NUM_SPLITS=splits)
        return tokens
    _biased_combine_kernel[(num_rows,)](
        part_values, part_ids, tokens, logits, logits.stride(0), bias_ids, bias_ids.stride(0), bias_values,
        bias_values.stride(0), saved, vocab_size, num_bias, penalties, prompt_counts, prompt_counts.stride(0),
        output_counts, output_counts.stride(0), grammar_mask, grammar_mask.stride(0), mask_rows, slots,
        NUM_SPLITS=splits, BLOCK_B=block_b, ROW_SLOTS=row_slots is not None,
    )
    return tokens


def _last_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()
