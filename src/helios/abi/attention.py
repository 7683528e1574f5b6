"""Execution ABI: paged attention and cache writes (namespace ``helios``).

Importing this module registers two custom ops with ``torch.library``. Captured programs call them;
``torch.export`` records them as opaque calls (their fake implementations give shapes only), so a
saved program depends on their schemas, never on their Python bodies. The bodies here are the CPU
reference implementations; they use plain torch ops (and read tensors on the host). On CUDA the ops
run the Triton kernels of `helios.abi.triton_attention` (imported on first use, so triton is needed
only where a CUDA tensor reaches these ops); those never synchronise, so they can be captured in a
CUDA graph.

Cache layout (one plane per layer, for keys and for values alike)::

    cache[P, page_tokens, Hkv, D]       position p of a row lives in page page_table[row, p // page_tokens]
                                        at offset p % page_tokens; its flat slot is page * page_tokens + offset

``helios::cache_write(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor slot_mapping) -> ()``
    k_cache, v_cache: [P, page_tokens, Hkv, D], mutated in place (no copy of the planes is made).
    k, v: [T, Hkv, D], the same dtype as the caches. slot_mapping: int64 [T]; token t is written to flat
    slot slot_mapping[t]; negative slots (padding) are skipped. Slots of one call must be distinct.

``helios::paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor query_start,
Tensor positions, float scale, int window) -> Tensor``
    q: [T, Hq, D] packed queries of R rows: row r owns packed tokens [query_start[r], query_start[r+1]).
    k_cache, v_cache: [P, page_tokens, Hkv, D] (read only), Hq a multiple of Hkv (grouped-query
    attention: query head h reads key/value head h // (Hq // Hkv)).
    page_table: int32 [R, max_pages]; entries past a row's last needed page are never read.
    query_start: int32 [R + 1], non-decreasing; a row with query_start[r] == query_start[r+1] is
    inactive. positions: int64 [T], the absolute position of each packed token.
    Token t of row r attends to every cached position c of row r with c <= positions[t] and, when
    window > 0, positions[t] - c < window (window == 0: no window). The caller writes this step's
    keys and values first, so a query sees its own key. scale multiplies q.k.
    Returns [T, Hq, D] in q's dtype; tokens at or past query_start[R] (padding) get zeros.
    Scores and the softmax are computed in float32.

``helios::paged_attention_tuned(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table,
Tensor query_start, Tensor positions, float scale, int window, Tensor splits) -> Tensor``
    Exactly the semantics of ``helios::paged_attention``. splits: int32 [1] on q's device, how many
    sequence splits the decode path uses (a schedule, never a result: any value gives the same
    attention; values are clamped to [1, a static maximum]). It is read on the device, so a captured
    CUDA graph replays whatever a startup tuning producer wrote there. The CPU reference and the
    prefill path ignore it.
"""

from __future__ import annotations

import torch

from helios.abi.op_library import abi_op
from helios.abi.paged_reference import attend, plan_attention
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

__all__ = [
    "CACHE_WRITE_SCHEMA", "PAGED_ATTENTION_SCHEMA", "PAGED_ATTENTION_TUNED_SCHEMA", "cache_write", "paged_attention",
    "paged_attention_tuned", "reference_cache_write",
]

CACHE_WRITE_SCHEMA = "(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor slot_mapping) -> ()"
PAGED_ATTENTION_SCHEMA = (
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor query_start, "
    "Tensor positions, float scale, int window) -> Tensor"
)
PAGED_ATTENTION_TUNED_SCHEMA = (
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor query_start, "
    "Tensor positions, float scale, int window, Tensor splits) -> Tensor"
)
_WRITE, _ATTEND = "helios::cache_write", "helios::paged_attention"
_TUNED = "helios::paged_attention_tuned"
_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Decode split schedule (helios.abi.triton_decode and startup tuning producers share it): about
# DECODE_PROGRAMS_PER_MULTIPROCESSOR decode programs per multiprocessor, at most one split per
# MIN_SPLIT_TOKENS positions of the capacity context, at most DECODE_MAX_SPLITS splits. Splits cut each
# token's own span, so a short row in a long capacity still uses every split. Two programs per
# multiprocessor, not more: on an H200 at batch 64 (512 programs of 8 key/value heads) eight per
# multiprocessor asked 3 splits and the partials and combine cost 10-23% over one split
# (bench/results/h200_kernels_session16/decode_attention.log); batch 1 is capped by the context anyway.
MIN_SPLIT_TOKENS = 128
DECODE_MAX_SPLITS = 64
DECODE_PROGRAMS_PER_MULTIPROCESSOR = 2


def check_cache_planes(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Validate a key/value plane pair [P, page_tokens, Hkv, D]; return its extents."""
    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4 or k_cache.dtype not in _CACHE_DTYPES:
        raise AbiArgumentError(f"{op}: k_cache must be a float tensor [P, page_tokens, Hkv, D]")
    check_tensor(op, "v_cache", v_cache, k_cache.dtype, tuple(k_cache.shape))
    return tuple(k_cache.shape)


def check_cache_write_args(k_cache, v_cache, k, v, slot_mapping) -> None:
    """Metadata-only validation of ``helios::cache_write`` (safe on fake tensors)."""
    _, _, num_kv_heads, head_dim = check_cache_planes(_WRITE, k_cache, v_cache)
    check_tensor(_WRITE, "k", k, k_cache.dtype, (None, num_kv_heads, head_dim))
    check_tensor(_WRITE, "v", v, k_cache.dtype, tuple(k.shape))
    check_tensor(_WRITE, "slot_mapping", slot_mapping, torch.int64, (k.shape[0],))
    check_same_device(_WRITE, dict(k_cache=k_cache, v_cache=v_cache, k=k, v=v, slot_mapping=slot_mapping))


def check_paged_attention_args(q, k_cache, v_cache, page_table, query_start, positions) -> None:
    """Metadata-only validation of ``helios::paged_attention`` (safe on fake tensors)."""
    _, _, num_kv_heads, head_dim = check_cache_planes(_ATTEND, k_cache, v_cache)
    check_tensor(_ATTEND, "q", q, k_cache.dtype, (None, None, head_dim))
    if q.shape[1] % num_kv_heads:
        raise AbiArgumentError(f"{_ATTEND}: {q.shape[1]} query heads are not a multiple of {num_kv_heads}")
    check_tensor(_ATTEND, "page_table", page_table, torch.int32, (None, None))
    check_tensor(_ATTEND, "query_start", query_start, torch.int32, (page_table.shape[0] + 1,))
    check_tensor(_ATTEND, "positions", positions, torch.int64, (q.shape[0],))
    tensors = dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table,
                   query_start=query_start, positions=positions)
    check_same_device(_ATTEND, tensors)


@abi_op(_WRITE, mutates_args=("k_cache", "v_cache"), schema=CACHE_WRITE_SCHEMA)
def cache_write(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check_cache_write_args(k_cache, v_cache, k, v, slot_mapping)
    reference_cache_write(k_cache, v_cache, k, v, slot_mapping)


def reference_cache_write(k_cache, v_cache, k, v, slot_mapping) -> None:
    """The CPU body of ``helios::cache_write`` on validated arguments (host reads: the slots'
    minimum); CPU callers that validated already may call it directly."""
    if slot_mapping.numel() and int(slot_mapping.min()) >= 0:  # no padding: every token is written
        slots, k, v = slot_mapping, k, v
    else:
        keep = slot_mapping >= 0
        slots, k, v = slot_mapping[keep], k[keep], v[keep]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


@cache_write.register_fake
def _cache_write_fake(k_cache, v_cache, k, v, slot_mapping) -> None:
    check_cache_write_args(k_cache, v_cache, k, v, slot_mapping)


@cache_write.register_kernel("cuda")
def _cache_write_cuda(k_cache, v_cache, k, v, slot_mapping) -> None:
    check_cache_write_args(k_cache, v_cache, k, v, slot_mapping)
    from helios.abi.triton_attention import triton_cache_write

    triton_cache_write(k_cache, v_cache, k, v, slot_mapping)


@abi_op(_ATTEND, mutates_args=(), schema=PAGED_ATTENTION_SCHEMA)
def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_start: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int,
) -> torch.Tensor:
    check_paged_attention_args(q, k_cache, v_cache, page_table, query_start, positions)
    return _reference_attention(q, k_cache, v_cache, page_table, query_start, positions, scale, window)


def _reference_attention(q, k_cache, v_cache, page_table, query_start, positions, scale: float,
                         window: int, sinks: torch.Tensor | None = None, softcap: float = 0.0,
                         chunk: int = 0) -> torch.Tensor:
    """The CPU reference of the attention ops (reads query_start and positions on the host):
    `helios.abi.paged_reference`'s plan and attention of one call; `sinks` (float32 [Hq], optional)
    adds one learned logit per query head to every softmax denominator; `softcap` > 0 caps the
    scores (``helios::paged_attention_softcap``); `chunk` > 0 keeps each query to its own chunk of
    positions (``helios::paged_attention_chunked``)."""
    plan = plan_attention(page_table, query_start, positions, window, k_cache, chunk)
    return attend(plan, q, k_cache, v_cache, scale, sinks, softcap)


@paged_attention.register_fake
def _paged_attention_fake(q, k_cache, v_cache, page_table, query_start, positions, scale, window):
    check_paged_attention_args(q, k_cache, v_cache, page_table, query_start, positions)
    return torch.empty_like(q)


@paged_attention.register_kernel("cuda")
def _paged_attention_cuda(q, k_cache, v_cache, page_table, query_start, positions, scale, window):
    check_paged_attention_args(q, k_cache, v_cache, page_table, query_start, positions)
    from helios.abi.triton_attention import triton_paged_attention

    return triton_paged_attention(q, k_cache, v_cache, page_table, query_start, positions, scale, window)


def check_paged_attention_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, splits) -> None:
    """Metadata-only validation of ``helios::paged_attention_tuned`` (safe on fake tensors)."""
    check_paged_attention_args(q, k_cache, v_cache, page_table, query_start, positions)
    check_splits(_TUNED, q, splits)


def check_splits(op: str, q, splits) -> None:
    """Metadata-only validation of a tuned attention op's decode split schedule: int32 [1] on q's device."""
    check_tensor(op, "splits", splits, torch.int32, (1,))
    check_same_device(op, dict(q=q, splits=splits))


@abi_op(_TUNED, mutates_args=(), schema=PAGED_ATTENTION_TUNED_SCHEMA)
def paged_attention_tuned(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_start: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int,
    splits: torch.Tensor,
) -> torch.Tensor:
    check_paged_attention_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, splits)
    return _reference_attention(q, k_cache, v_cache, page_table, query_start, positions, scale, window)


@paged_attention_tuned.register_fake
def _paged_attention_tuned_fake(q, k_cache, v_cache, page_table, query_start, positions, scale, window, splits):
    check_paged_attention_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, splits)
    return torch.empty_like(q)


@paged_attention_tuned.register_kernel("cuda")
def _paged_attention_tuned_cuda(q, k_cache, v_cache, page_table, query_start, positions, scale, window, splits):
    check_paged_attention_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, splits)
    from helios.abi.triton_attention import triton_paged_attention_tuned

    return triton_paged_attention_tuned(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                        splits)
