"""Triton kernels of ``helios::sample``'s random draws on CUDA (CPU under TRITON_INTERPRET=1), without a sort.

`draw_rows` computes steps 6-8 of `helios.abi.sampling`'s docstring for every drawing row: the token
at the inverse-CDF position of the canonical order (probability descending, id ascending on ties)
after top-k, top-p and min-p. The reference's device path sorts the whole row (a stable float64
sort of V values and their ids: 64% of its time at 256 rows x 128k on an H100,
bench/results/h100_session54/parts.log) and then scans it a dozen times. But every quantity the
draw needs is a count or a mass of a *prefix* of the canonical order, and a prefix is the set of
tokens whose probability bits (a non-negative float64 read as an int64: the same order) are above
a key, plus the lowest ids among those equal to it. So each is found by selection instead:

1. `_exp_sum_kernel` (SPLITS programs a row): the softmax's sum of exp(z - max z), z = value /
   temperature sanitised as the reference does; max z is the greedy token's.
2. `_probability_kernel`: stores p = exp(z - max z) / sum in place of the values; counts p > 0 and
   p >= min_p * p_max; counts and masses by *first bucket*: 2**FIRST_GROUP exponents below p_max's
   a bucket, the last bucket every smaller p.
3. `_partition_kernel`: copies each row's p and ids into candidate lists grouped by first bucket,
   each group in id order (a counting sort by bucket, in parallel over the splits).
4. `_draw_kernel` (one program a row): `_first_failing` finds the first canonical position at which
   a monotone predicate on the prefix (count <= limit, mass < or <= tau) fails. The first buckets
   locate the crossing bucket; passes over its candidates only then histogram their keys into
   NUM_BUCKETS digits, take every digit before the crossing whole and narrow to the crossing digit,
   until one key is left, whose equal tokens are taken in id order. With it: top-k is the mass of
   the first k positions; top-p the first position whose preceding mass is not below top_p times
   that (the reference's strict ``below``); min-p a count; the draw the first position whose prefix
   mass exceeds u times the kept mass, clamped to the last kept token with p > 0.

Equal values give equal probabilities and share every bucket, so ties follow the canonical order
exactly. The masses are float64 sums in another order than the reference's prefix sums (which on
CUDA are a parallel scan, rounded otherwise than the CPU's too): a token differs from the
reference's only where that rounding moves a boundary comparison, as `helios.abi.sampling`'s
docstring allows for the device path (no difference in 8,192 rows on an H100). Nothing depends on
other rows or the row count (splits, blocks, buckets and warps are fixed), so a row's token is the
same alone or in any batch.

The same passes serve the speculative ops on CUDA: `kept_weights` (``helios::sampling_weights``)
ends the selection at the kept prefix's last position instead of drawing and zeroes the tokens after
it in one more pass; `draw_from_weights` (``helios::draw_weighted``) selects over given weights
(``RAW``: no softmax, the row maximum in place of p_max, no filters).

Measured on an H100 in CUDA graphs against the sorted path it replaced (bench/results/h100_session54/
draw_sweep.log; flat and peaked 128k rows, temperature alone, with top-p 0.95, with top-k 50 and
top-p 0.9; FIRST_GROUP 1): 1.15-1.2x as fast at 1 row, 1.9-2.1x at 8, 2.1-2.2x at 64, 2.6x at 256.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["draw_from_weights", "draw_rows", "kept_weights"]

SPLITS = 16  # programs per row of the two passes over whole rows (fixed: sums must not depend on the batch)
ROW_BLOCK = 1024  # ids per loop iteration of those passes
ROW_WARPS = 4
NUM_BUCKETS = 16
SELECT_WARPS = 8  # warps of the one program per row that selects
SELECT_BLOCK = 32 * SELECT_WARPS  # candidates per loop iteration of a narrowing pass (one per thread)
TIE_BLOCK = 2048  # candidates per loop iteration of the pass that finds the nth of equal ones
FIRST_GROUP = 1  # log2 of the exponents one bucket of the first (whole-row) histogram holds
_F64_MAX = tl.constexpr(1.7976931348623157e308)
_MAX_KEY = tl.constexpr(0x7FFFFFFFFFFFFFFF)


def draw_rows(values: torch.Tensor, greedy: torch.Tensor, drawing: torch.Tensor, temperature: torch.Tensor,
              top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """int64 [R]: the drawn token of each `drawing` row, `greedy` elsewhere.

    `values` is the float64 [R, V] output of steps 1-4 (`helios.abi.triton_sampling.greedy_tokens`'
    ``values_out``) and is overwritten with the drawing rows' probabilities; `greedy` is that pass's
    token per row (the row maximum's lowest id); `uniforms` the rows' float64 `uniform53` draws.
    """
    greedy, drawing, temperature, top_k, top_p, min_p, uniforms = _row_vectors(
        values, greedy, drawing, temperature, top_k, top_p, min_p, uniforms)
    tokens = torch.empty_like(greedy)
    if values.shape[0]:
        selection = _Selection(values, drawing, temperature, min_p, raw=False)
        selection.select(greedy, top_k, top_p, uniforms, tokens, keep=False)
    return tokens


def kept_weights(values: torch.Tensor, greedy: torch.Tensor, drawing: torch.Tensor, temperature: torch.Tensor,
                 top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """``helios::sampling_weights`` of steps 1-4's `values` (as `draw_rows` takes them), written in
    place and returned: a drawing row's kept prefix (top-k, top-p, min-p, at least one position)
    keeps its probabilities and every other token 0; any other row is one-hot at `greedy`, all
    zeros where `greedy` is -1 (no allowed token).

    The kept prefix ends at the canonical position ``kept - 1`` that the draw kernel's rules give;
    its (probability, id) is the boundary, and a token is kept where its probability is above the
    boundary's, or equal with an id at most the boundary's."""
    greedy, drawing, temperature, top_k, top_p, min_p = _row_vectors(values, greedy, drawing, temperature, top_k,
                                                                     top_p, min_p)
    num_rows = values.shape[0]
    if num_rows:
        boundary = torch.empty((num_rows, 2), dtype=torch.int64, device=values.device)
        selection = _Selection(values, drawing, temperature, min_p, raw=False)
        selection.select(greedy, top_k, top_p, torch.zeros_like(temperature, dtype=torch.float64), boundary,
                         keep=True)
        _keep_kernel[(num_rows, SPLITS)](values, values.stride(0), drawing, greedy, boundary, values.shape[1],
                                         selection.chunk, BLOCK_V=ROW_BLOCK, num_warps=ROW_WARPS)
    return values


def draw_from_weights(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``helios::draw_weighted`` on CUDA: int64 [R], each row's token at the inverse-CDF position of
    `uniforms` (float64 `uniform53` values) in the canonical order of its non-negative float64
    `weights` [R, V] (left unchanged): the first position whose prefix mass exceeds u times the row's
    mass, at most the last positive weight; -1 for a row without one."""
    (uniforms,) = _row_vectors(weights, uniforms)
    num_rows = weights.shape[0]
    tokens = torch.full((num_rows,), -1, dtype=torch.int64, device=weights.device)
    if num_rows:
        best = weights.max(dim=-1)
        drawing = best.values > 0
        greedy = torch.where(drawing, best.indices, -1)
        zeros = torch.zeros((num_rows,), dtype=torch.float32, device=weights.device)  # the controls' types
        selection = _Selection(weights, drawing, zeros, zeros, raw=True)
        selection.select(greedy, zeros.to(torch.int32), zeros + 1.0, uniforms, tokens, keep=False)
    return tokens


def _row_vectors(values: torch.Tensor, *vectors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`vectors` (the per-row [R] arguments) contiguous, as the kernels index them (``pointer + row``);
    `values` must hold each row's ids contiguously (the kernels take its row stride only).

    A runtime's program passes strided views: ``temperature``, ``top_p`` and ``min_p`` are columns of
    the packed [R, 7] sampling parameters (`helios.abi.sampling.split_sampling_parameters`, stride
    7), which read as contiguous gave row r the parameters at ``r`` entries past row 0's column (row
    1's temperature was row 0's top_k, 0: on CUDA a sampled choice drew 1, 0, 1, 0, ...). A copy of
    R entries where one is needed; no host read, so a CUDA graph holds it."""
    if values.dim() != 2 or (values.shape[1] > 1 and values.stride(1) != 1):
        raise ValueError(f"triton_draws: values must be [R, V] with contiguous rows, got strides {values.stride()}")
    return tuple(vector.contiguous() for vector in vectors)


class _Selection:
    """The three passes over whole rows (sum; bucket histograms; candidate lists) for `select`.

    ``raw`` False: `values` are steps 1-4's float64 values, replaced by the drawing rows' softmax
    probabilities at `temperature`. ``raw`` True: `values` are already the probabilities (weights, not
    normalised), read only; `temperature` and `min_p` are then unused zeros."""

    def __init__(self, values: torch.Tensor, drawing: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor,
                 raw: bool):
        num_rows, vocab_size = values.shape
        device = values.device
        self.chunk = -(-vocab_size // (SPLITS * ROW_BLOCK)) * ROW_BLOCK
        self.drawing, self.raw, self.vocab_size = drawing, raw, vocab_size
        self.bests = torch.empty((num_rows,), dtype=torch.float64, device=device)
        self.totals = torch.empty((num_rows,), dtype=torch.float64, device=device)
        self.sums = torch.empty((num_rows, SPLITS), dtype=torch.float64, device=device)
        self.counts = torch.empty((num_rows, SPLITS, 2), dtype=torch.int64, device=device)
        self.bucket_counts = torch.empty((num_rows, SPLITS, NUM_BUCKETS), dtype=torch.int64, device=device)
        self.bucket_masses = torch.empty((num_rows, SPLITS, NUM_BUCKETS), dtype=torch.float64, device=device)
        self.candidate_p = torch.empty((num_rows, vocab_size), dtype=torch.float64, device=device)
        self.candidate_ids = torch.empty((num_rows, vocab_size), dtype=torch.int32, device=device)
        self.values, self.temperature, self.min_p = values, temperature, min_p

    def select(self, greedy, top_k, top_p, uniforms, out, keep: bool) -> None:
        """Writes each row's drawn token into `out` [R] (`greedy` for rows that do not draw) or, with
        `keep`, its kept prefix's boundary into `out` [R, 2] (probability bits, id)."""
        num_rows = self.values.shape[0]
        rows = (self.values, self.values.stride(0), self.drawing, self.temperature, self.bests, self.sums,
                self.totals)
        whole = dict(S=SPLITS, BLOCK_V=ROW_BLOCK, RAW=self.raw, num_warps=ROW_WARPS)
        _exp_sum_kernel[(num_rows, SPLITS)](*rows, greedy, self.vocab_size, self.chunk, **whole)
        _probability_kernel[(num_rows, SPLITS)](*rows, self.min_p, self.counts, self.bucket_counts,
                                                self.bucket_masses, self.vocab_size, self.chunk, NB=NUM_BUCKETS,
                                                GROUP=FIRST_GROUP, **whole)
        _partition_kernel[(num_rows, SPLITS)](*rows, self.bucket_counts, self.candidate_p, self.candidate_ids,
                                              self.vocab_size, self.chunk, NB=NUM_BUCKETS, GROUP=FIRST_GROUP,
                                              **whole)
        _draw_kernel[(num_rows,)](
            greedy, self.drawing, top_k, top_p, uniforms, self.bests, self.totals, self.counts, self.bucket_counts,
            self.bucket_masses, self.candidate_p, self.candidate_ids, out, self.vocab_size, S=SPLITS,
            BLOCK_V=SELECT_BLOCK, WIDE=TIE_BLOCK, NB=NUM_BUCKETS, GROUP=FIRST_GROUP, RAW=self.raw, KEEP=keep,
            num_warps=SELECT_WARPS)


@triton.jit
def _scaled(x, temp):
    """The reference's z: x / temperature, NaN -> -inf, +inf -> float64 max."""
    z = x / temp
    z = tl.where(z != z, float("-inf"), z)
    return tl.where(z == float("inf"), _F64_MAX, z)


@triton.jit
def _split_range(chunk, vocab_size):
    start = tl.program_id(1).to(tl.int64) * chunk
    return start, tl.minimum(start + chunk, vocab_size)


@triton.jit
def _exp_sum_kernel(values, stride, drawing, temperature, bests, sums, totals, greedy, vocab_size, chunk,
                    S: tl.constexpr, BLOCK_V: tl.constexpr, RAW: tl.constexpr):
    """sums[row, split]: the sum of exp(z - max z) over the split's ids of a drawing row; bests[row]:
    max z (the greedy token's z: division by a temperature > 0 keeps the order). RAW: the sum of the
    values themselves, and bests[row] the `greedy` id's value (the row maximum)."""
    row = tl.program_id(0)
    total = tl.zeros((), tl.float64)
    if tl.load(drawing + row).to(tl.int32) != 0:
        row_p = values + row.to(tl.int64) * stride
        temp = tl.load(temperature + row).to(tl.float64)
        if RAW:
            best = tl.load(row_p + tl.load(greedy + row))
        else:
            best = _scaled(tl.load(row_p + tl.load(greedy + row)), temp)
        if tl.program_id(1) == 0:
            tl.store(bests + row, best)
        lanes = tl.zeros((BLOCK_V,), tl.float64)
        start, end = _split_range(chunk, vocab_size)
        for offset in range(start, end, BLOCK_V):
            ids = offset + tl.arange(0, BLOCK_V)
            if RAW:
                lanes += tl.load(row_p + ids, mask=ids < end, other=0.0)
            else:
                x = tl.load(row_p + ids, mask=ids < end, other=float("-inf"))
                lanes += tl.exp(_scaled(x, temp) - best)
        total = tl.sum(lanes, axis=0)
    tl.store(sums + row * S + tl.program_id(1), total)


@triton.jit
def _probability_kernel(values, stride, drawing, temperature, bests, sums, totals, min_p, counts, bucket_counts,
                        bucket_masses, vocab_size, chunk, S: tl.constexpr, BLOCK_V: tl.constexpr, NB: tl.constexpr,
                        GROUP: tl.constexpr, RAW: tl.constexpr):
    """Stores p = exp(z - max z) / sum over the split's ids of a drawing row (RAW: p is the value, not
    stored, and min_p is 0); per split: the counts of p > 0 and of p >= min_p * p_max, and counts and
    masses by exponent bucket (the first narrowing pass of every selection: bucket b holds the
    exponents 2**GROUP * b to 2**GROUP * (b + 1) - 1 below p_max's, the last every smaller one)."""
    row = tl.program_id(0)
    if tl.load(drawing + row).to(tl.int32) != 0:
        row_p = values + row.to(tl.int64) * stride
        temp = tl.load(temperature + row).to(tl.float64)
        best = tl.load(bests + row)
        total = tl.sum(tl.load(sums + row * S + tl.arange(0, S)), axis=0)
        if tl.program_id(1) == 0:  # the one sum every later kernel reads (a reduction elsewhere could round otherwise)
            tl.store(totals + row, total)
        if RAW:  # (not from `totals`: split 0 stores it in this same launch, after other splits may read)
            key_max = best.to(tl.int64, bitcast=True)
        else:
            key_max = (1.0 / total).to(tl.int64, bitcast=True)
        top = key_max >> 52
        threshold = tl.load(min_p + row).to(tl.float64) * key_max.to(tl.float64, bitcast=True)
        buckets = tl.arange(0, NB)
        bucket_count = tl.zeros((NB,), tl.int64)
        bucket_mass = tl.zeros((NB,), tl.float64)
        positive = tl.zeros((), tl.int64)
        kept_m = tl.zeros((), tl.int64)
        start, end = _split_range(chunk, vocab_size)
        for offset in range(start, end, BLOCK_V):
            ids = offset + tl.arange(0, BLOCK_V)
            inside = ids < end
            if RAW:
                p = tl.load(row_p + ids, mask=inside, other=0.0)
            else:
                x = tl.load(row_p + ids, mask=inside, other=float("-inf"))
                p = tl.exp(_scaled(x, temp) - best) / total
                tl.store(row_p + ids, p, mask=inside)
            positive += tl.sum((inside & (p > 0.0)).to(tl.int64), axis=0)
            kept_m += tl.sum((inside & (p >= threshold)).to(tl.int64), axis=0)
            bucket = tl.minimum((top - (p.to(tl.int64, bitcast=True) >> 52)) >> GROUP, NB - 1)
            hit = (bucket[:, None] == buckets[None, :]) & inside[:, None]
            bucket_count += tl.sum(hit.to(tl.int64), axis=0)
            bucket_mass += tl.sum(tl.where(hit, p[:, None], 0.0), axis=0)
        base = (row * S + tl.program_id(1)).to(tl.int64)
        tl.store(counts + base * 2, positive)
        tl.store(counts + base * 2 + 1, kept_m)
        tl.store(bucket_counts + base * NB + buckets, bucket_count)
        tl.store(bucket_masses + base * NB + buckets, bucket_mass)


@triton.jit
def _partition_kernel(values, stride, drawing, temperature, bests, sums, totals, bucket_counts, candidate_p,
                      candidate_ids, vocab_size, chunk, S: tl.constexpr, BLOCK_V: tl.constexpr, NB: tl.constexpr,
                      GROUP: tl.constexpr, RAW: tl.constexpr):
    """Copies a drawing row's p and ids into its candidate lists grouped by first-histogram bucket
    (bucket 0's first), each bucket's tokens in id order: the split's tokens of bucket b go after
    those of every smaller bucket and of bucket b in every earlier split."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    if tl.load(drawing + row).to(tl.int32) != 0:
        row_p = values + row.to(tl.int64) * stride
        top = _key_max(bests, totals, row, RAW) >> 52
        buckets = tl.arange(0, NB)
        splits = tl.arange(0, S)
        table = tl.load(bucket_counts + (row * S + splits)[:, None] * NB + buckets[None, :])
        sizes = tl.sum(table, axis=0)  # each bucket's tokens in the row
        slots = tl.cumsum(sizes, axis=0) - sizes + tl.sum(tl.where(splits[:, None] < split, table, 0), axis=0)
        out = row.to(tl.int64) * vocab_size
        start, end = _split_range(chunk, vocab_size)
        for offset in range(start, end, BLOCK_V):
            ids = offset + tl.arange(0, BLOCK_V)
            inside = ids < end
            p = tl.load(row_p + ids, mask=inside, other=0.0)
            bucket = tl.minimum((top - (p.to(tl.int64, bitcast=True) >> 52)) >> GROUP, NB - 1)
            hit = (bucket[:, None] == buckets[None, :]) & inside[:, None]
            rank = tl.cumsum(hit.to(tl.int32), axis=0)
            slot = out + tl.sum(tl.where(hit, slots[None, :] + rank - 1, 0), axis=1)
            tl.store(candidate_p + slot, p, mask=inside)
            tl.store(candidate_ids + slot, ids.to(tl.int32), mask=inside)
            slots += tl.sum(hit.to(tl.int64), axis=0)


@triton.jit
def _draw_kernel(greedy, drawing, top_k, top_p, uniforms, bests, totals, counts, bucket_counts, bucket_masses,
                 candidate_p, candidate_ids, out, vocab_size, S: tl.constexpr, BLOCK_V: tl.constexpr,
                 WIDE: tl.constexpr, NB: tl.constexpr, GROUP: tl.constexpr, RAW: tl.constexpr, KEEP: tl.constexpr):
    """A drawing row's kept prefix (top-k, top-p, min-p) and draw: out[row] its token (`greedy` for other
    rows); with KEEP, out[row] = (probability bits, id) of the kept prefix's last position instead,
    nothing for other rows."""
    row = tl.program_id(0)
    token = tl.load(greedy + row)
    if tl.load(drawing + row).to(tl.int32) != 0:
        size = tl.full((), 0, tl.int64) + vocab_size
        lists = (candidate_p + row.to(tl.int64) * vocab_size, candidate_ids + row.to(tl.int64) * vocab_size, size)
        splits = tl.arange(0, S)
        key_max = _key_max(bests, totals, row, RAW)
        positive = tl.sum(tl.load(counts + (row * S + splits) * 2), axis=0)
        kept_m = tl.sum(tl.load(counts + (row * S + splits) * 2 + 1), axis=0)
        cells = (row * S + splits)[:, None] * NB + tl.arange(0, NB)[None, :]
        first = (tl.sum(tl.load(bucket_counts + cells), axis=0), tl.sum(tl.load(bucket_masses + cells), axis=0))
        mass = tl.sum(first[1], axis=0)
        inf = float("inf")
        # top-k: the first k positions and their mass
        k = tl.load(top_k + row).to(tl.int64)
        kept_k = size
        mass_k = mass
        if (k > 0) & (k < size):
            _, _, mass_k, _ = _first_failing(lists, key_max, first, k, inf, False, BLOCK_V, WIDE, NB, GROUP)
            kept_k = k
        # top-p: positions whose preceding mass is below top_p times the top-k mass
        top = tl.load(top_p + row).to(tl.float64)
        kept_p = size
        mass_p = mass
        if not (top >= 1.0):  # on unless top_p >= 1 (a NaN top_p keeps the first position alone, as the reference)
            failed, _, before, failed_p = _first_failing(lists, key_max, first, kept_k, top * mass_k, True, BLOCK_V,
                                                         WIDE, NB, GROUP)
            kept_p = tl.minimum(failed + 1, size)
            mass_p = tl.where(failed < size, before + failed_p, before)
        kept = tl.maximum(tl.minimum(tl.minimum(kept_k, kept_p), kept_m), 1)
        if KEEP:  # the last kept position: the first whose prefix holds more than kept - 1 tokens
            last_key = tl.zeros((), tl.int64)  # every p > 0 kept (p = 0 is a weight of 0 either way):
            last = tl.full((), -1, tl.int64)  # no search, which would end deep in the tail
            if kept < positive:
                _, last, _, last_p = _first_failing(lists, key_max, first, kept - 1, inf, False, BLOCK_V, WIDE, NB,
                                                    GROUP)
                last_key = last_p.to(tl.int64, bitcast=True)
            tl.store(out + row * 2, last_key)
            tl.store(out + row * 2 + 1, last)
        else:
            kept_mass = mass_k
            if kept != kept_k:
                kept_mass = mass_p
                if kept != kept_p:
                    _, _, kept_mass, _ = _first_failing(lists, key_max, first, kept, inf, False, BLOCK_V, WIDE, NB,
                                                        GROUP)
            # the draw: the first position whose mass exceeds u * kept mass, at most the last kept p > 0
            drawable = tl.minimum(kept, positive)
            target = tl.load(uniforms + row) * kept_mass
            _, drawn, _, _ = _first_failing(lists, key_max, first, drawable - 1, target, False, BLOCK_V, WIDE, NB,
                                            GROUP)
            token = tl.where(drawn >= 0, drawn, token)
    if not KEEP:
        tl.store(out + row, token)


@triton.jit
def _key_max(bests, totals, row, RAW: tl.constexpr):
    """The bits of a drawing row's largest p: the softmax's exp(0) / sum, or (RAW) the row maximum, as
    `_probability_kernel` computed it (for the kernels launched after it)."""
    if RAW:
        return tl.load(bests + row).to(tl.int64, bitcast=True)
    else:
        return (1.0 / tl.load(totals + row)).to(tl.int64, bitcast=True)


@triton.jit
def _keep_kernel(values, stride, drawing, greedy, boundary, vocab_size, chunk, BLOCK_V: tl.constexpr):
    """Zeroes a drawing row's probabilities outside its kept prefix (above the boundary's, or equal
    with an id at most its id); writes every other row one-hot at `greedy` (all zeros at -1)."""
    row = tl.program_id(0)
    row_p = values + row.to(tl.int64) * stride
    start, end = _split_range(chunk, vocab_size)
    if tl.load(drawing + row).to(tl.int32) != 0:
        key = tl.load(boundary + row * 2)
        last = tl.load(boundary + row * 2 + 1)
        for offset in range(start, end, BLOCK_V):
            ids = offset + tl.arange(0, BLOCK_V)
            p = tl.load(row_p + ids, mask=ids < end, other=0.0)
            bits = p.to(tl.int64, bitcast=True)
            kept = (bits > key) | ((bits == key) & (ids <= last))
            tl.store(row_p + ids, tl.where(kept, p, 0.0), mask=ids < end)
    else:
        token = tl.load(greedy + row)
        for offset in range(start, end, BLOCK_V):
            ids = offset + tl.arange(0, BLOCK_V)
            tl.store(row_p + ids, tl.where(ids == token, 1.0, 0.0).to(tl.float64), mask=ids < end)


@triton.jit
def _mass_fails(mass, tau, STRICT: tl.constexpr):
    """Whether a prefix of mass `mass` breaks the mass bound (not < tau if STRICT, else not <= tau):
    written as the negation, so that a NaN bound fails at every prefix as the reference's ``below`` does."""
    if STRICT:
        return (mass < tau) == 0
    else:
        return (mass <= tau) == 0


@triton.jit
def _crossing(counts, masses, above_n, above_m, limit, tau, STRICT: tl.constexpr, NB: tl.constexpr,
              INSIDE: tl.constexpr):
    """The first bucket holding a position that breaks the predicate, and the count and mass of the
    positions before it. Where none does: NB, or with INSIDE (the buckets are known to hold the
    crossing, which only rounding can hide) the last bucket holding a token."""
    buckets = tl.arange(0, NB)
    cum_n = above_n + tl.cumsum(counts, axis=0)
    cum_m = above_m + tl.cumsum(masses, axis=0)
    fails = (counts > 0) & ((cum_n > limit) | _mass_fails(cum_m, tau, STRICT))
    j = tl.min(tl.where(fails, buckets, NB), axis=0)
    if INSIDE:
        j = tl.where(j == NB, tl.max(tl.where(counts > 0, buckets, 0), axis=0), j)
    previous = buckets == j - 1
    above_n = tl.where(j > 0, tl.sum(tl.where(previous, cum_n, 0), axis=0), above_n)
    above_m = tl.where(j > 0, tl.sum(tl.where(previous, cum_m, 0.0), axis=0), above_m)
    return j, above_n, above_m


@triton.jit
def _first_failing(lists, key_max, first, limit, tau, STRICT: tl.constexpr, BLOCK_V: tl.constexpr,
                   WIDE: tl.constexpr, NB: tl.constexpr, GROUP: tl.constexpr):
    """The first canonical position j whose prefix (positions 0..j) has more than `limit` tokens or a
    mass not below `tau` (not at most `tau` unless STRICT): (j, its token id, the mass of positions
    before j, its p). Where every position holds: (V, -1, the whole mass, 0).

    `first` is the exponent histogram of the whole row (`_probability_kernel`): the first narrowing.
    Every further narrowing reads only the crossing bucket's tokens (`_partition_kernel` grouped the
    row's candidate lists by that bucket): NB buckets of the range's keys, a bucket a digit of the
    smallest shift that fits the range in NB digits, until one key is left."""
    candidate_p, candidate_ids, size = lists
    counts, masses = first
    j, above_n, above_m = _crossing(counts, masses, tl.zeros((), tl.int64), tl.zeros((), tl.float64), limit, tau,
                                    STRICT, NB, False)
    position = size
    token = tl.full((), -1, tl.int64)
    token_p = tl.zeros((), tl.float64)
    if j == NB:  # every position holds
        above_m = tl.sum(masses, axis=0)
    else:  # exponents 2**GROUP * j ... below p_max's (the last bucket: every smaller one)
        e_high = (key_max >> 52) - (j << GROUP)
        e_low = tl.where(j == NB - 1, 0, tl.maximum(e_high - (1 << GROUP) + 1, 0))
        lo = e_low << 52
        hi = tl.minimum(key_max, ((e_high + 1) << 52) - 1)
        listed = tl.sum(tl.where(tl.arange(0, NB) == j, counts, 0), axis=0)
        region = tl.sum(tl.where(tl.arange(0, NB) < j, counts, 0), axis=0)
        candidate_p += region
        candidate_ids += region
        searching = tl.full((), 1, tl.int32)
        while searching != 0:
            shift = tl.zeros((), tl.int64)
            while (hi >> shift) - (lo >> shift) >= NB:
                shift += 1
            top = hi >> shift
            counts, masses, key_lo, key_hi = _histogram(candidate_p, listed, lo, hi, shift, top, BLOCK_V, NB)
            if key_hi < 0:  # nothing in range: never, as the stored sums make every bucket's range hold its
                searching = 0  # tokens; a stop rather than a loop all the same (no token: the caller's fallback)
            elif key_lo == key_hi:  # one value left (one token, or equal ones): its tokens in id order
                q = key_lo.to(tl.float64, bitcast=True)
                taken = _tied_prefix(above_n, above_m, q, tl.sum(counts, axis=0), limit, tau, STRICT)
                position = above_n + taken
                above_m = above_m + taken.to(tl.float64) * q
                token = _nth_equal(candidate_p, candidate_ids, listed, key_lo, taken, WIDE)
                token_p = q
                searching = 0
            else:
                j, above_n, above_m = _crossing(counts, masses, above_n, above_m, limit, tau, STRICT, NB, True)
                lo = tl.maximum(lo, (top - j) << shift)
                hi = tl.minimum(hi, ((top - j + 1) << shift) - 1)
    return position, token, above_m, token_p


@triton.jit
def _histogram(candidate_p, listed, lo, hi, shift, top, BLOCK_V: tl.constexpr, NB: tl.constexpr):
    """Counts and masses of the candidates whose key is in [lo, hi], by bucket top - (key >> shift)
    (bucket 0 holds the largest keys), and the smallest and largest key among them. Each lane sums
    its own candidates; the lanes are reduced once, at the end."""
    buckets = tl.arange(0, NB)
    lane_counts = tl.zeros((BLOCK_V, NB), tl.int32)
    lane_masses = tl.zeros((BLOCK_V, NB), tl.float64)
    lane_lo = tl.full((BLOCK_V,), _MAX_KEY, tl.int64)
    lane_hi = tl.full((BLOCK_V,), -1, tl.int64)
    for offset in range(0, listed, BLOCK_V):
        index = offset + tl.arange(0, BLOCK_V)
        p = tl.load(candidate_p + index, mask=index < listed, other=-1.0)
        key = p.to(tl.int64, bitcast=True)
        inside = (key >= lo) & (key <= hi)
        hit = ((top - (key >> shift))[:, None] == buckets[None, :]) & inside[:, None]
        lane_counts += hit.to(tl.int32)
        lane_masses += tl.where(hit, p[:, None], 0.0)
        lane_lo = tl.minimum(lane_lo, tl.where(inside, key, _MAX_KEY))
        lane_hi = tl.maximum(lane_hi, tl.where(inside, key, -1))
    return (tl.sum(lane_counts, axis=0).to(tl.int64), tl.sum(lane_masses, axis=0), tl.min(lane_lo, axis=0),
            tl.max(lane_hi, axis=0))


@triton.jit
def _tied_prefix(above_n, above_m, q, count, limit, tau, STRICT: tl.constexpr):
    """How many of `count` tokens of probability `q` after a prefix (above_n tokens, mass above_m)
    still hold the predicate, at most count - 1 (the failing position is among them)."""
    if q > 0.0:
        guess = tl.floor((tau - above_m) / q)
        guess = tl.where(guess == guess, guess, 0.0)  # a NaN bound: no tied token holds (the loops confirm)
        guess = tl.minimum(tl.maximum(guess, 0.0), count.to(tl.float64))
        taken = guess.to(tl.int64)
        while (taken > 0) & _mass_fails(above_m + taken.to(tl.float64) * q, tau, STRICT):
            taken -= 1
        while (taken < count) & (_mass_fails(above_m + (taken + 1).to(tl.float64) * q, tau, STRICT) == 0):
            taken += 1
    else:
        taken = tl.where(_mass_fails(above_m, tau, STRICT), 0, count)
    taken = tl.minimum(taken, limit - above_n)
    return tl.maximum(tl.minimum(taken, count - 1), 0)


@triton.jit
def _nth_equal(candidate_p, candidate_ids, listed, key, nth, BLOCK_V: tl.constexpr):
    """The id of the `nth` (0-based, in id order) candidate whose probability bits are `key`."""
    seen = tl.zeros((), tl.int64)
    found = tl.full((), -1, tl.int64)
    for offset in range(0, listed, BLOCK_V):
        index = offset + tl.arange(0, BLOCK_V)
        p = tl.load(candidate_p + index, mask=index < listed, other=-1.0)
        equal = p.to(tl.int64, bitcast=True) == key
        rank = seen + tl.cumsum(equal.to(tl.int64), axis=0) - 1
        hit = equal & (rank == nth)
        ids = tl.load(candidate_ids + index, mask=hit, other=-1).to(tl.int64)
        found = tl.maximum(found, tl.max(tl.where(hit, ids, -1), axis=0))
        seen += tl.sum(equal.to(tl.int64), axis=0)
    return found
