"""Execution ABI: token selection for sparse latent attention (DeepSeek Sparse Attention, namespace ``helios``).

A token-selecting indexer (`helios.ignition.token_indexer`) keeps one key vector of D values per
token in a paged plane of its own, beside the latent region's planes and through the same page
tables (position p of a row lives in page page_table[row, p // page_tokens] at offset p % page_tokens)::

    index_cache[P, page_tokens, D]

Importing this module registers three ops. Their bodies are plain torch without host reads (no
``.item()``, no boolean indexing), so they serve the CPU and, unchanged, CUDA (no Triton kernel
yet; without host reads a program calling them should capture into a CUDA graph, which no GPU run
has checked yet). They are references, not fast
kernels: ``index_topk`` scores every position of every row's page table. Both work through the packed
tokens a few at a time (`WORKSPACE_BYTES` of float32 workspace), so long rows do not multiply memory.

``helios::index_key_write(Tensor(a!) index_cache, Tensor keys, Tensor slot_mapping) -> ()``
    keys: [T, D] in the cache's dtype; token t is written to flat slot slot_mapping[t] (int64 [T]);
    negative slots (padding) write nothing. Slots of one call are distinct.

``helios::index_topk(Tensor q, Tensor weights, Tensor index_cache, Tensor page_table, Tensor query_start,
Tensor positions, float scale, int topk) -> Tensor``
    q: [T, H, D] (the cache's dtype), weights: float32 [T, H]. Token t of row r (packed as in
    ``helios::paged_attention``) scores each cached position c <= positions[t] of its row as
    sum_h weights[t, h] * relu(scale * q[t, h] . key[c]) (float32, the reference's order: products,
    scale, ReLU, then the weighted sum over heads) and returns the `topk` best positions, int64
    [T, topk], best first; -1 fills the entries past a token's positions <= positions[t] (all of
    them for padding tokens). Ties: among equal scores the earlier position wins (a stable sort).
    The reference calls ``torch.topk``, whose order among equal values is unspecified (on the CPU it
    changes with the row's length: ``torch.zeros(20).topk(5)`` gives 12, 14, 13, 15, 11), so no rule
    reproduces it in general; the two can pick different sets only where a tie straddles the topk-th
    score.

``helios::paged_latent_attention_selected(Tensor q_latent, Tensor q_rope, Tensor latent_cache,
Tensor rope_cache, Tensor page_table, Tensor query_start, Tensor positions, Tensor selected,
float scale) -> Tensor``
    ``helios::paged_latent_attention`` (absorbed latent attention, same arguments and result
    [T, H, C]) restricted to each token's `selected` positions (int64 [T, K], -1 entries skipped,
    as ``index_topk`` returns them). Float32 scores and softmax; a token with no selected position
    (padding) gets zeros.
"""

from __future__ import annotations

import torch

from helios.abi.latent_attention import check_latent_planes
from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

__all__ = ["INDEX_KEY_WRITE_SCHEMA", "INDEX_TOPK_SCHEMA", "SELECTED_ATTENTION_SCHEMA", "index_key_write",
           "index_topk", "paged_latent_attention_selected", "token_rows"]

INDEX_KEY_WRITE_SCHEMA = "(Tensor(a!) index_cache, Tensor keys, Tensor slot_mapping) -> ()"
INDEX_TOPK_SCHEMA = (
    "(Tensor q, Tensor weights, Tensor index_cache, Tensor page_table, Tensor query_start, Tensor positions, "
    "float scale, int topk) -> Tensor"
)
SELECTED_ATTENTION_SCHEMA = (
    "(Tensor q_latent, Tensor q_rope, Tensor latent_cache, Tensor rope_cache, Tensor page_table, "
    "Tensor query_start, Tensor positions, Tensor selected, float scale) -> Tensor"
)
_WRITE, _TOPK, _ATTEND = "helios::index_key_write", "helios::index_topk", "helios::paged_latent_attention_selected"
_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The bodies score and attend a few packed tokens at a time, so that their float32 workspace (keys
# gathered per token, per-head scores) stays about this size however long the rows are.
WORKSPACE_BYTES = 1 << 28


def _check_index_plane(op: str, index_cache) -> tuple[int, int, int]:
    if not isinstance(index_cache, torch.Tensor) or index_cache.dim() != 3 or index_cache.dtype not in _CACHE_DTYPES:
        raise AbiArgumentError(f"{op}: index_cache must be a float tensor [P, page_tokens, D]")
    return tuple(index_cache.shape)


def _check_packing(op: str, page_table, query_start, positions, num_tokens: int) -> None:
    check_tensor(op, "page_table", page_table, torch.int32, (None, None))
    check_tensor(op, "query_start", query_start, torch.int32, (page_table.shape[0] + 1,))
    check_tensor(op, "positions", positions, torch.int64, (num_tokens,))


def check_index_write_args(index_cache, keys, slot_mapping) -> None:
    """Metadata-only validation of ``helios::index_key_write`` (safe on fake tensors)."""
    _, _, width = _check_index_plane(_WRITE, index_cache)
    check_tensor(_WRITE, "keys", keys, index_cache.dtype, (None, width))
    check_tensor(_WRITE, "slot_mapping", slot_mapping, torch.int64, (keys.shape[0],))
    check_same_device(_WRITE, dict(index_cache=index_cache, keys=keys, slot_mapping=slot_mapping))


def check_index_topk_args(q, weights, index_cache, page_table, query_start, positions, topk: int) -> None:
    """Metadata-only validation of ``helios::index_topk`` (safe on fake tensors)."""
    _, _, width = _check_index_plane(_TOPK, index_cache)
    check_tensor(_TOPK, "q", q, index_cache.dtype, (None, None, width))
    check_tensor(_TOPK, "weights", weights, torch.float32, (q.shape[0], q.shape[1]))
    _check_packing(_TOPK, page_table, query_start, positions, q.shape[0])
    if topk < 1:
        raise AbiArgumentError(f"{_TOPK}: topk must be >= 1, got {topk}")
    check_same_device(_TOPK, dict(q=q, weights=weights, index_cache=index_cache, page_table=page_table,
                                  query_start=query_start, positions=positions))


def check_selected_args(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start, positions,
                        selected) -> None:
    """Metadata-only validation of ``helios::paged_latent_attention_selected`` (safe on fake tensors)."""
    _, _, latent_dim, rope_dim = check_latent_planes(_ATTEND, latent_cache, rope_cache)
    check_tensor(_ATTEND, "q_latent", q_latent, latent_cache.dtype, (None, None, latent_dim))
    check_tensor(_ATTEND, "q_rope", q_rope, latent_cache.dtype, (q_latent.shape[0], q_latent.shape[1], rope_dim))
    _check_packing(_ATTEND, page_table, query_start, positions, q_latent.shape[0])
    check_tensor(_ATTEND, "selected", selected, torch.int64, (q_latent.shape[0], None))
    check_same_device(_ATTEND, dict(q_latent=q_latent, q_rope=q_rope, latent_cache=latent_cache,
                                    rope_cache=rope_cache, page_table=page_table, query_start=query_start,
                                    positions=positions, selected=selected))


def token_rows(query_start: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(each packed token's row, clamped into the table; whether it is packed or padding) [T]."""
    num_rows = query_start.shape[0] - 1
    index = torch.arange(num_tokens, device=query_start.device, dtype=query_start.dtype)
    rows = torch.searchsorted(query_start[1:].contiguous(), index, right=True).clamp(max=num_rows - 1)
    return rows, index < query_start[num_rows]


@abi_op(_WRITE, mutates_args=("index_cache",), schema=INDEX_KEY_WRITE_SCHEMA)
def index_key_write(index_cache: torch.Tensor, keys: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    check_index_write_args(index_cache, keys, slot_mapping)
    if keys.shape[0] == 0:
        return
    flat = index_cache.view(-1, index_cache.shape[2])
    keep = slot_mapping >= 0
    # No host read: padding tokens rewrite the first packed token's slot with its own key (or, with no
    # packed token at all, slot 0 with its current value), so duplicate writes all carry one value.
    first = torch.argmax(keep.to(torch.int32)).view(1)  # a 1-element index: a 0-d one is read on the host
    target = torch.where(keep, slot_mapping, slot_mapping[first].clamp(min=0))
    source = torch.where(keep[:, None], keys, keys[first])
    source = torch.where(keep.any(), source, flat[target])
    flat.index_put_((target,), source)


@index_key_write.register_fake
def _index_key_write_fake(index_cache, keys, slot_mapping) -> None:
    check_index_write_args(index_cache, keys, slot_mapping)


@abi_op(_TOPK, mutates_args=(), schema=INDEX_TOPK_SCHEMA)
def index_topk(q: torch.Tensor, weights: torch.Tensor, index_cache: torch.Tensor, page_table: torch.Tensor,
               query_start: torch.Tensor, positions: torch.Tensor, scale: float, topk: int) -> torch.Tensor:
    check_index_topk_args(q, weights, index_cache, page_table, query_start, positions, topk)
    rows, packed = token_rows(query_start, q.shape[0])
    pages = page_table[rows].clamp(0, index_cache.shape[0] - 1).to(torch.int64)  # [T, max_pages]
    context = page_table.shape[1] * index_cache.shape[1]  # L: every position of a row's page table
    per_token = 4 * context * (index_cache.shape[2] + q.shape[1] + 4)  # float32 keys, head scores, scores
    return torch.cat([_top_positions(q[s], weights[s], index_cache, pages[s], positions[s], packed[s], scale, topk)
                      for s in _chunks(q.shape[0], per_token)])


def _top_positions(q, weights, index_cache, pages, positions, packed, scale: float, topk: int) -> torch.Tensor:
    """`index_topk` of some packed tokens: their rows' pages [n, max_pages], positions, packed flags."""
    num_tokens = q.shape[0]
    keys = index_cache[pages].reshape(num_tokens, -1, index_cache.shape[2]).float()  # [n, L, D]
    scores = torch.relu(torch.matmul(q.float(), keys.transpose(1, 2)) * scale)  # [n, H, L]
    index_scores = torch.matmul(weights.unsqueeze(1), scores).squeeze(1)  # [n, L]
    candidates = torch.arange(keys.shape[1], device=q.device)
    valid = (candidates[None, :] <= positions[:, None]) & packed[:, None]
    index_scores = index_scores.masked_fill(~valid, float("-inf"))
    if keys.shape[1] < topk:  # fewer positions than picks: the rest stay -1
        pad = topk - keys.shape[1]
        index_scores = torch.cat((index_scores, index_scores.new_full((num_tokens, pad), float("-inf"))), dim=1)
        valid = torch.cat((valid, valid.new_zeros((num_tokens, pad))), dim=1)
    order = torch.sort(index_scores, dim=-1, descending=True, stable=True).indices[:, :topk]
    return torch.where(valid.gather(1, order), order, torch.full_like(order, -1))


def _chunks(num_tokens: int, per_token: int) -> list[slice]:
    """Slices of the packed tokens whose workspace (`per_token` bytes each) stays within
    `WORKSPACE_BYTES`: static extents, so a captured program's shapes do not change."""
    step = max(1, WORKSPACE_BYTES // max(1, per_token))
    return [slice(start, min(start + step, num_tokens)) for start in range(0, max(num_tokens, 1), step)]


@index_topk.register_fake
def _index_topk_fake(q, weights, index_cache, page_table, query_start, positions, scale, topk):
    check_index_topk_args(q, weights, index_cache, page_table, query_start, positions, topk)
    return q.new_empty((q.shape[0], topk), dtype=torch.int64)


@abi_op(_ATTEND, mutates_args=(), schema=SELECTED_ATTENTION_SCHEMA)
def paged_latent_attention_selected(q_latent: torch.Tensor, q_rope: torch.Tensor, latent_cache: torch.Tensor,
                                    rope_cache: torch.Tensor, page_table: torch.Tensor, query_start: torch.Tensor,
                                    positions: torch.Tensor, selected: torch.Tensor, scale: float) -> torch.Tensor:
    check_selected_args(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start, positions, selected)
    page_tokens = latent_cache.shape[1]
    rows, _ = token_rows(query_start, q_latent.shape[0])
    picked = selected.clamp(min=0)
    page_index = torch.div(picked, page_tokens, rounding_mode="floor").clamp(max=page_table.shape[1] - 1)
    pages = page_table[rows].gather(1, page_index).clamp(0, latent_cache.shape[0] - 1).to(torch.int64)
    slots = pages * page_tokens + torch.remainder(picked, page_tokens)  # [T, K]
    width = latent_cache.shape[2] + rope_cache.shape[2]
    per_token = 4 * selected.shape[1] * (2 * width + 2 * q_latent.shape[1])  # float32 keys, latents, scores
    planes = (latent_cache.view(-1, latent_cache.shape[2]), rope_cache.view(-1, rope_cache.shape[2]))
    return torch.cat([_attend_selected(q_latent[s], q_rope[s], planes, slots[s], selected[s] >= 0, scale)
                      for s in _chunks(q_latent.shape[0], per_token)])


def _attend_selected(q_latent, q_rope, planes, slots, chosen, scale: float) -> torch.Tensor:
    """`paged_latent_attention_selected` of some packed tokens: their selected flat slots [n, K] of
    the flattened planes and which of them are picks."""
    latent, rope = (plane[slots].float() for plane in planes)  # [n, K, C], [n, K, R]
    keys = torch.cat((latent, rope), dim=-1)
    queries = torch.cat((q_latent, q_rope), dim=-1).float()  # [n, H, C + R]
    scores = torch.matmul(queries, keys.transpose(1, 2)) * scale  # [n, H, K]
    scores = scores.masked_fill(~chosen[:, None, :], float("-inf"))
    probabilities = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a token without picks: all zeros
    # The -1 entries read some slot; whatever it holds (a NaN of an unwritten page) must weigh nothing.
    latent = latent.masked_fill(~chosen[:, :, None], 0.0)
    return torch.matmul(probabilities, latent).to(q_latent.dtype)


@paged_latent_attention_selected.register_fake
def _selected_fake(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start, positions, selected, scale):
    check_selected_args(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start, positions, selected)
    return torch.empty_like(q_latent)
