"""Execution ABI: the paged latent history of multi-head latent attention (namespace ``helios``).

Importing this module registers two custom ops with ``torch.library``; the bodies here are the CPU
references (plain torch, they read ``query_start`` on the host). On CUDA the ops run the Triton kernels
of `helios.abi.triton_latent` (imported on first use), which never synchronise, so a program calling
them can be captured into a CUDA graph.

A paged latent region keeps, per token, one compressed key/value vector shared by every head (the
latent, C = kv_lora_rank values) and one rotary key shared by every head (R = qk_rope_head_dim
values), in two planes per layer::

    latent_cache[P, page_tokens, C]      position p of a row lives in page page_table[row, p // page_tokens]
    rope_cache[P, page_tokens, R]        at offset p % page_tokens; its flat slot is page * page_tokens + offset

``helios::latent_cache_write(Tensor(a!) latent_cache, Tensor(b!) rope_cache, Tensor latent, Tensor rope,
Tensor slot_mapping) -> ()``
    latent: [T, C], rope: [T, R], the caches' dtype. slot_mapping: int64 [T]; token t is written to
    flat slot slot_mapping[t]; negative slots (padding) are skipped. Slots of one call are distinct.

``helios::paged_latent_attention(Tensor q_latent, Tensor q_rope, Tensor latent_cache, Tensor rope_cache,
Tensor page_table, Tensor query_start, Tensor positions, float scale) -> Tensor``
    The absorbed form of latent attention: the caller has folded each head's key up-projection into
    its query (q_latent: [T, H, C]) and keeps the rotary part apart (q_rope: [T, H, R]). Token t of
    row r (packed as in ``helios::paged_attention``: query_start int32 [R + 1], positions int64 [T],
    page_table int32 [R, max_pages]) attends to every cached position c <= positions[t] of its row
    with score scale * (q_latent[t, h] . latent[c] + q_rope[t, h] . rope[c]) and returns
    sum_c softmax(score)_c * latent[c]: [T, H, C] in q's dtype (the caller applies each head's value
    up-projection). Padding tokens (at or past query_start[R]) get zeros. Float32 scores and softmax.
"""

from __future__ import annotations

import torch

from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

__all__ = ["LATENT_CACHE_WRITE_SCHEMA", "PAGED_LATENT_ATTENTION_SCHEMA", "latent_cache_write",
           "paged_latent_attention"]

LATENT_CACHE_WRITE_SCHEMA = (
    "(Tensor(a!) latent_cache, Tensor(b!) rope_cache, Tensor latent, Tensor rope, Tensor slot_mapping) -> ()"
)
PAGED_LATENT_ATTENTION_SCHEMA = (
    "(Tensor q_latent, Tensor q_rope, Tensor latent_cache, Tensor rope_cache, Tensor page_table, "
    "Tensor query_start, Tensor positions, float scale) -> Tensor"
)
_WRITE, _ATTEND = "helios::latent_cache_write", "helios::paged_latent_attention"
_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_latent_planes(op: str, latent_cache, rope_cache) -> tuple[int, int, int, int]:
    """Validate a latent plane pair ([P, page_tokens, C], [P, page_tokens, R]); return (P, page_tokens, C, R)."""
    if not isinstance(latent_cache, torch.Tensor) or latent_cache.dim() != 3 or latent_cache.dtype not in _CACHE_DTYPES:
        raise AbiArgumentError(f"{op}: latent_cache must be a float tensor [P, page_tokens, C]")
    pages, page_tokens, latent_dim = latent_cache.shape
    check_tensor(op, "rope_cache", rope_cache, latent_cache.dtype, (pages, page_tokens, None))
    return pages, page_tokens, latent_dim, rope_cache.shape[2]


def check_latent_write_args(latent_cache, rope_cache, latent, rope, slot_mapping) -> None:
    """Metadata-only validation of ``helios::latent_cache_write`` (safe on fake tensors)."""
    _, _, latent_dim, rope_dim = check_latent_planes(_WRITE, latent_cache, rope_cache)
    check_tensor(_WRITE, "latent", latent, latent_cache.dtype, (None, latent_dim))
    check_tensor(_WRITE, "rope", rope, latent_cache.dtype, (latent.shape[0], rope_dim))
    check_tensor(_WRITE, "slot_mapping", slot_mapping, torch.int64, (latent.shape[0],))
    check_same_device(_WRITE, dict(latent_cache=latent_cache, rope_cache=rope_cache, latent=latent, rope=rope,
                                   slot_mapping=slot_mapping))


def check_latent_attention_args(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start,
                                positions) -> None:
    """Metadata-only validation of ``helios::paged_latent_attention`` (safe on fake tensors)."""
    _, _, latent_dim, rope_dim = check_latent_planes(_ATTEND, latent_cache, rope_cache)
    check_tensor(_ATTEND, "q_latent", q_latent, latent_cache.dtype, (None, None, latent_dim))
    check_tensor(_ATTEND, "q_rope", q_rope, latent_cache.dtype, (q_latent.shape[0], q_latent.shape[1], rope_dim))
    check_tensor(_ATTEND, "page_table", page_table, torch.int32, (None, None))
    check_tensor(_ATTEND, "query_start", query_start, torch.int32, (page_table.shape[0] + 1,))
    check_tensor(_ATTEND, "positions", positions, torch.int64, (q_latent.shape[0],))
    check_same_device(_ATTEND, dict(q_latent=q_latent, q_rope=q_rope, latent_cache=latent_cache,
                                    rope_cache=rope_cache, page_table=page_table, query_start=query_start,
                                    positions=positions))


@abi_op(_WRITE, mutates_args=("latent_cache", "rope_cache"), schema=LATENT_CACHE_WRITE_SCHEMA)
def latent_cache_write(latent_cache: torch.Tensor, rope_cache: torch.Tensor, latent: torch.Tensor,
                       rope: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    check_latent_write_args(latent_cache, rope_cache, latent, rope, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    latent_cache.view(-1, latent_cache.shape[2]).index_copy_(0, slots, latent[keep])
    rope_cache.view(-1, rope_cache.shape[2]).index_copy_(0, slots, rope[keep])


@latent_cache_write.register_fake
def _latent_cache_write_fake(latent_cache, rope_cache, latent, rope, slot_mapping) -> None:
    check_latent_write_args(latent_cache, rope_cache, latent, rope, slot_mapping)


@latent_cache_write.register_kernel("cuda")
def _latent_cache_write_cuda(latent_cache, rope_cache, latent, rope, slot_mapping) -> None:
    check_latent_write_args(latent_cache, rope_cache, latent, rope, slot_mapping)
    from helios.abi.triton_latent import triton_latent_cache_write

    triton_latent_cache_write(latent_cache, rope_cache, latent, rope, slot_mapping)


@abi_op(_ATTEND, mutates_args=(), schema=PAGED_LATENT_ATTENTION_SCHEMA)
def paged_latent_attention(q_latent: torch.Tensor, q_rope: torch.Tensor, latent_cache: torch.Tensor,
                           rope_cache: torch.Tensor, page_table: torch.Tensor, query_start: torch.Tensor,
                           positions: torch.Tensor, scale: float) -> torch.Tensor:
    check_latent_attention_args(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start, positions)
    out = q_latent.new_zeros(q_latent.shape)
    bounds = query_start.tolist()
    for row in range(len(bounds) - 1):
        start, end = bounds[row], bounds[row + 1]
        if end > start:
            out[start:end] = _attend_row(q_latent[start:end], q_rope[start:end], latent_cache, rope_cache,
                                         page_table[row], positions[start:end], scale)
    return out


@paged_latent_attention.register_fake
def _paged_latent_attention_fake(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start, positions,
                                 scale):
    check_latent_attention_args(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start, positions)
    return torch.empty_like(q_latent)


@paged_latent_attention.register_kernel("cuda")
def _paged_latent_attention_cuda(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start, positions,
                                 scale):
    check_latent_attention_args(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start, positions)
    from helios.abi.triton_latent import triton_paged_latent_attention

    return triton_paged_latent_attention(q_latent, q_rope, latent_cache, rope_cache, page_table, query_start,
                                         positions, scale)


def _attend_row(q_latent, q_rope, latent_cache, rope_cache, pages, positions, scale: float) -> torch.Tensor:
    """One row's queries [n, H, C] / [n, H, R] over its cached positions 0..max(positions)."""
    page_tokens = latent_cache.shape[1]
    context_len = int(positions.max()) + 1
    num_pages = -(-context_len // page_tokens)
    if num_pages > pages.shape[0]:
        raise AbiArgumentError(f"{_ATTEND}: position {context_len - 1} needs {num_pages} pages; "
                               f"the page table has {pages.shape[0]}")
    page_ids = pages[:num_pages].long()
    latent = latent_cache[page_ids].reshape(-1, latent_cache.shape[2])[:context_len].float()
    rope = rope_cache[page_ids].reshape(-1, rope_cache.shape[2])[:context_len].float()
    keys = torch.cat((latent, rope), dim=-1)[None]  # one key head shared by every query head
    queries = torch.cat((q_latent, q_rope), dim=-1).float().transpose(0, 1)  # [H, n, C + R]
    allowed = torch.arange(context_len, device=positions.device)[None, :] <= positions[:, None]
    attended = torch.nn.functional.scaled_dot_product_attention(
        queries, keys, latent[None], attn_mask=allowed, scale=scale, enable_gqa=True)
    return attended.transpose(0, 1).to(q_latent.dtype)
