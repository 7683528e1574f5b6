"""The CPU reference of paged attention (``helios::paged_attention``, its tuned and sink variants)
in two stages, so that what every layer of a step shares is computed once per step.

`plan_attention(page_table, query_start, positions, window, k_cache, chunk)` reads the step's row bounds
and positions on the host and builds an `AttentionPlan`: which rows attend together with one query
each (a decode step's rows), which rows attend with several (prompt chunks), the page ids each
gathers and the positions each query may see (as the bool mask and as the additive float mask that
``scaled_dot_product_attention`` makes of it). `attend(plan, q, k_cache, v_cache, scale, sinks,
softcap)` is then one layer's attention: gather the pages, attend, place the rows. The ops' bodies run both
stages per call; a CPU program builds one plan per step for all its layers
(`helios.runtime.loading.cpu_programs`). Either way the same kernels run on the same values, so the
results are bit for bit the same: the additive mask holds exactly what SDPA derives from the bool
one (0 where visible, -inf elsewhere, in the queries' float32).

A chunk (``helios::paged_attention_chunked``, > 0) further limits a query at position p to its own
chunk, the positions c with c // chunk == p // chunk (c >= p - p % chunk).

A plan depends on the page table, the row bounds, the positions, the window, the chunk and the plane
geometry (pages, page tokens) only; it holds no cache values, so a step's cache writes between
layers do not invalidate it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy
import torch

from helios.abi.registry import AbiArgumentError

_ATTEND = "helios::paged_attention"


class _Group(NamedTuple):
    """Rows that attend with one query each, batched over a shared padded context."""

    tokens: slice | torch.Tensor  # their queries in q (and their outputs)
    page_ids: torch.Tensor  # int64 [rows * pages], flat: the pages each row gathers
    num_rows: int
    allowed: torch.Tensor  # bool [rows, 1, 1, L]: position c visible to the row's query
    mask: torch.Tensor  # float32 [rows, 1, 1, L]: 0 where allowed, -inf elsewhere


class _Row(NamedTuple):
    """One row with several queries (a prompt chunk), over its own context."""

    start: int
    end: int
    page_ids: torch.Tensor  # int64 [pages]
    context_len: int
    allowed: torch.Tensor  # bool [n, context_len]
    mask: torch.Tensor  # float32 [n, context_len]


class AttentionPlan(NamedTuple):
    """What every layer of one step shares (see the module docstring). `full`: the group covers
    every packed token in order (a full decode step), so its result is the whole output."""

    num_tokens: int
    plane_pages: int
    page_tokens: int
    full: bool
    group: _Group | None
    rows: tuple[_Row, ...]


def plan_attention(page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor, window: int,
                   k_cache: torch.Tensor, chunk: int = 0) -> AttentionPlan:
    """The step's plan over validated arguments (reads query_start and positions on the host);
    `chunk` > 0 keeps each query to its own chunk of positions (see the module docstring)."""
    plane_pages, page_tokens = k_cache.shape[0], k_cache.shape[1]
    bounds = query_start.tolist()
    count = len(bounds) - 1
    num_tokens = positions.shape[0]
    if count == num_tokens and bounds == list(range(count + 1)):  # a full decode step: row r owns token r
        group = _group(slice(0, count), page_table, positions, window, plane_pages, page_tokens, chunk)
        return AttentionPlan(num_tokens, plane_pages, page_tokens, True, group, ())
    rows, single_rows, single_tokens = [], [], []
    for row in range(count):
        start, end = bounds[row], bounds[row + 1]
        if end - start == 1:
            single_rows.append(row)
            single_tokens.append(start)
        elif end > start:
            rows.append(_row(start, end, page_table[row], positions[start:end], window, page_tokens, chunk))
    group = None
    if single_rows:
        count = len(single_rows)
        if single_rows[-1] == count - 1 and single_tokens[-1] == count - 1:  # rows 0..n-1 own tokens 0..n-1
            group = _group(slice(0, count), page_table[:count], positions[:count], window, plane_pages,
                           page_tokens, chunk)
        else:  # decoding lanes among prompt rows, attended together
            tokens = torch.tensor(single_tokens, device=positions.device)
            chosen = torch.tensor(single_rows, device=positions.device)
            group = _group(tokens, page_table[chosen], positions[tokens], window, plane_pages, page_tokens, chunk)
    return AttentionPlan(num_tokens, plane_pages, page_tokens, False, group, tuple(rows))


def attend(plan: AttentionPlan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
           sinks: torch.Tensor | None = None, softcap: float = 0.0) -> torch.Tensor:
    """One layer's attention [T, Hq, D] (q's dtype) over `plan`; padding tokens get zeros.
    `sinks` (float32 [Hq], optional) adds one learned logit per query head to each denominator;
    `softcap` > 0 caps every scaled score at ``tanh(s / softcap) * softcap`` before the mask."""
    if k_cache.shape[0] != plan.plane_pages or k_cache.shape[1] != plan.page_tokens:
        raise AbiArgumentError(f"{_ATTEND}: planned for planes of {plan.plane_pages} pages of {plan.page_tokens} "
                               f"tokens, got {list(k_cache.shape[:2])}")
    group = plan.group
    if plan.full:
        return _attend_group(group, q, k_cache, v_cache, scale, sinks, softcap)
    out = torch.zeros_like(q)
    for row in plan.rows:
        out[row.start:row.end] = _attend_row(row, q[row.start:row.end], k_cache, v_cache, scale, sinks, softcap)
    if group is not None:
        out[group.tokens] = _attend_group(group, q[group.tokens], k_cache, v_cache, scale, sinks, softcap)
    return out


def _group(tokens, page_table, positions, window: int, plane_pages: int, page_tokens: int, chunk: int = 0) -> _Group:
    if positions.device.type == "cpu" and page_table.device.type == "cpu":
        return _group_host(tokens, page_table, positions, window, plane_pages, page_tokens, chunk)
    return _group_torch(tokens, page_table, positions, window, plane_pages, page_tokens, chunk)


def _group_torch(tokens, page_table, positions, window: int, plane_pages: int, page_tokens: int,
                 chunk: int = 0) -> _Group:
    context_len = int(positions.max()) + 1
    num_pages = _pages_needed(context_len, page_tokens, page_table.shape[1])
    # A shorter row's entries past its last page may hold anything: clamped into the plane, the
    # pages they name are read but masked (a masked position's weight is exactly 0).
    # int64 indices: every layer's two gathers index with them, and int32 ones cost each gather a
    # conversion (the same rows either way).
    page_ids = page_table[:, :num_pages].clamp(0, plane_pages - 1).to(torch.int64)
    cached = torch.arange(num_pages * page_tokens, device=positions.device)
    allowed = _allowed(cached, positions, window, chunk)[:, None, None, :]
    return _Group(tokens, page_ids.reshape(-1), page_ids.shape[0], allowed, _additive(allowed))


def _group_host(tokens, page_table, positions, window: int, plane_pages: int, page_tokens: int,
                chunk: int = 0) -> _Group:
    """`_group` for CPU tensors, computed in numpy over views of them: the same page ids and
    masks (integer comparisons, 0 and -inf) in a few array operations of about a microsecond each
    instead of a dozen torch calls. Without a window, a row's masks are the rows of `_causal`'s
    tables at its position (one gather each instead of a comparison and a select)."""
    where = positions.numpy()
    context_len = int(where.max()) + 1
    table_pages = page_table.shape[1]
    num_pages = _pages_needed(context_len, page_tokens, table_pages)
    span = num_pages * page_tokens
    ids = page_table.numpy()[:, :num_pages]
    page_ids = numpy.minimum(numpy.maximum(ids, 0), plane_pages - 1).astype(numpy.int64)  # clip, without a wrapper
    if window <= 0 and chunk <= 0 and where.min() >= 0:
        visible, additive = _causal(table_pages * page_tokens)
        allowed, mask = visible[where, :span], additive[where, :span]
    else:
        cached = numpy.arange(span)
        allowed = cached[None, :] <= where[:, None]
        if window > 0:
            allowed &= where[:, None] - cached[None, :] < window
        if chunk > 0:
            allowed &= cached[None, :] >= (where - where % chunk)[:, None]
        mask = numpy.where(allowed, numpy.float32(0.0), numpy.float32(-numpy.inf))
    return _Group(tokens, torch.from_numpy(page_ids.reshape(-1)), page_ids.shape[0],
                  torch.from_numpy(allowed[:, None, None, :]), torch.from_numpy(mask[:, None, None, :]))


_CAUSAL: dict[int, tuple[numpy.ndarray, numpy.ndarray]] = {}


def _causal(extent: int) -> tuple[numpy.ndarray, numpy.ndarray]:
    """(bool [L, L], float32 [L, L]) for L = `extent`: row p is position c <= p visible, and the
    additive mask of that (0 where visible, -inf elsewhere); built once per extent, read-only."""
    tables = _CAUSAL.get(extent)
    if tables is None:
        cached = numpy.arange(extent)
        visible = cached[None, :] <= cached[:, None]
        additive = numpy.where(visible, numpy.float32(0.0), numpy.float32(-numpy.inf))
        visible.flags.writeable = additive.flags.writeable = False
        tables = _CAUSAL[extent] = (visible, additive)
    return tables


def _pages_needed(context_len: int, page_tokens: int, table_pages: int) -> int:
    num_pages = -(-context_len // page_tokens)
    if num_pages > table_pages:
        raise AbiArgumentError(f"{_ATTEND}: position {context_len - 1} needs {num_pages} pages; the page table has {table_pages}")
    return num_pages


def _row(start: int, end: int, pages, positions, window: int, page_tokens: int, chunk: int = 0) -> _Row:
    context_len = int(positions.max()) + 1
    num_pages = _pages_needed(context_len, page_tokens, pages.shape[0])
    allowed = _allowed(torch.arange(context_len, device=positions.device), positions, window, chunk)
    return _Row(start, end, pages[:num_pages].to(torch.int64), context_len, allowed, _additive(allowed))


def _attend_group(group: _Group, q, k_cache, v_cache, scale: float, sinks, softcap: float = 0.0) -> torch.Tensor:
    """Attention of the group's rows, one query each [n, Hq, D], over their padded contexts."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    shape = (group.num_rows, -1, num_kv_heads, head_dim)
    keys = _float(k_cache.index_select(0, group.page_ids).view(shape).transpose(1, 2))
    values = _float(v_cache.index_select(0, group.page_ids).view(shape).transpose(1, 2))
    queries = _float(q).unsqueeze(2)  # [n, Hq, 1, D]
    attended = _softmax_attention(queries, keys, values, group, scale, sinks, softcap).squeeze(2)
    return attended if attended.dtype == q.dtype else attended.to(q.dtype)


def _attend_row(row: _Row, q, k_cache, v_cache, scale: float, sinks, softcap: float = 0.0) -> torch.Tensor:
    """Attention of one row's queries [n, Hq, D] over its cached positions 0..context_len - 1."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    keys = _float(k_cache.index_select(0, row.page_ids).view(-1, num_kv_heads, head_dim)[:row.context_len].transpose(0, 1))
    values = _float(v_cache.index_select(0, row.page_ids).view(-1, num_kv_heads, head_dim)[:row.context_len].transpose(0, 1))
    queries = q.float().transpose(0, 1)  # [Hq, n, D]
    attended = _softmax_attention(queries, keys, values, row, scale, sinks, softcap)
    return attended.transpose(0, 1).to(q.dtype)


def _float(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.dtype == torch.float32 else tensor.float()


def _allowed(cached: torch.Tensor, positions: torch.Tensor, window: int, chunk: int = 0) -> torch.Tensor:
    """bool [n, L]: cached position c is visible to query position p (c <= p, inside the window
    and, with `chunk` > 0, inside p's chunk)."""
    allowed = cached[None, :] <= positions[:, None]
    if window > 0:
        allowed &= positions[:, None] - cached[None, :] < window
    if chunk > 0:
        allowed &= cached[None, :] >= (positions - torch.remainder(positions, chunk))[:, None]
    return allowed


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    """The float32 mask SDPA derives from a bool one: 0 where allowed, -inf elsewhere."""
    return torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def _softmax_attention(queries, keys, values, masks: _Group | _Row, scale: float, sinks=None,
                       softcap: float = 0.0) -> torch.Tensor:
    """softmax(scale * q.k, masked) . v in float32, query heads grouped over the key/value heads
    (head h reads key/value head h // (Hq // Hkv)); one fused op instead of a dozen small ones.
    Every query sees at least its own position, so no row is fully masked. Query heads are dim -3.
    With `sinks` [Hq], each head's sink logit joins the softmax's denominator (and adds no value).
    With `softcap` > 0 the scaled scores s become ``tanh(s / softcap) * softcap`` before the mask
    (Gemma 2's attention logit soft cap, in the reference's order)."""
    if softcap > 0.0:
        return _capped_attention(queries, keys, values, masks, scale, sinks, softcap)
    if sinks is None:
        return torch.nn.functional.scaled_dot_product_attention(
            queries, keys, values, attn_mask=masks.mask, scale=scale, enable_gqa=True)
    group = queries.shape[-3] // keys.shape[-3]
    keys, values = keys.repeat_interleave(group, dim=-3), values.repeat_interleave(group, dim=-3)
    scores = torch.matmul(queries, keys.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~masks.allowed, float("-inf"))
    sink = sinks.to(torch.float32).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    combined = torch.cat((scores, sink), dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    return torch.matmul(probs, values)


def _capped_attention(queries, keys, values, masks: _Group | _Row, scale: float, sinks, softcap: float):
    """`_softmax_attention` with the soft cap: scores, cap, mask, (sink), softmax, values."""
    group = queries.shape[-3] // keys.shape[-3]
    keys, values = keys.repeat_interleave(group, dim=-3), values.repeat_interleave(group, dim=-3)
    scores = torch.tanh(torch.matmul(queries, keys.transpose(-1, -2)) * scale / softcap) * softcap
    scores = scores.masked_fill(~masks.allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.to(torch.float32).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
        return torch.matmul(torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1], values)
    return torch.matmul(torch.softmax(scores, dim=-1), values)
