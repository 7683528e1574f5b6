"""Execution ABI: rotary embedding, cache write and paged attention of one layer as one op.

``helios::rotary_paged_attention(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin,
Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, Tensor page_table, Tensor query_start,
Tensor positions, float scale, int window, Tensor? sinks, Tensor? splits) -> Tensor``
    Exactly ``helios::rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)`` (see
    `helios.abi.fused`) followed by the attention of its rotated q over the written planes:
    ``helios::paged_attention`` (see `helios.abi.attention`), with ``sinks`` (float32 [Hq])
    ``helios::paged_attention_sinks``, with ``splits`` (int32 [1]) the tuned variants (a schedule,
    never a result). ``prefetch``: a tensor on q's device that the step reads next (the output
    projection's weight); on CUDA the decode launch asks the L2 cache to fetch it while the attention
    runs (a schedule hint: it is never read for the result). Returns [T, Hq, D] contiguous; k_cache
    and v_cache are mutated in place.

Why one op: a decode step's layer otherwise launches the rotary kernel (which writes the rotated q
and the cache entries) and then the decode attention kernel, whose launch and first dependent loads
are the latency of a batch-1 step. On CUDA, when the step is decode-shaped (T <= R, the decode
kernel's dispatch), one launch of the decode kernel with its rotary prologue
(`helios.abi.triton_decode_rotary`) does both: the query is rotated as it is loaded and never
stored, and the programs that read this step's positions write them first. The roundings are
those of the two-kernel sequence, so the result and the planes are bit for bit the same. Prefill-
shaped steps run the two kernels. The CPU body is the reference: the two ops' CPU bodies in order.

Programs are not prepared with this op: the CUDA loader can rewrite each rotary_cache_write whose
rotated q only feeds the attention over the same planes into one call when it captures a program
(`helios.runtime.loading.rotary_calls`, switched by its FUSE_AT_CAPTURE), so cores stay as they are
and the CPU path is untouched.
"""

from __future__ import annotations

import torch

from helios.abi.attention import _reference_attention, check_paged_attention_args
from helios.abi.fused import check_rotary_cache_write_args, rotary_cache_write
from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

__all__ = ["ROTARY_PAGED_ATTENTION_SCHEMA", "check_rotary_paged_attention_args", "rotary_paged_attention"]

ROTARY_PAGED_ATTENTION_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
    "Tensor slot_mapping, Tensor page_table, Tensor query_start, Tensor positions, float scale, int window, "
    "Tensor? sinks, Tensor? splits, Tensor? prefetch=None) -> Tensor"
)
_OP = "helios::rotary_paged_attention"


def check_rotary_paged_attention_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                      positions, sinks, splits, prefetch=None) -> None:
    """Metadata-only validation (safe on fake tensors): the two ops' checks, sinks and splits."""
    check_rotary_cache_write_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
    check_paged_attention_args(q, k_cache, v_cache, page_table, query_start, positions)
    if sinks is not None:
        check_tensor(_OP, "sinks", sinks, torch.float32, (q.shape[1],))
        check_same_device(_OP, dict(q=q, sinks=sinks))
    if splits is not None:
        check_tensor(_OP, "splits", splits, torch.int32, (1,))
        check_same_device(_OP, dict(q=q, splits=splits))
    if prefetch is not None:
        if not isinstance(prefetch, torch.Tensor):
            raise AbiArgumentError(f"{_OP}: prefetch must be a tensor or None")
        check_same_device(_OP, dict(q=q, prefetch=prefetch))


@abi_op(_OP, mutates_args=("k_cache", "v_cache"), schema=ROTARY_PAGED_ATTENTION_SCHEMA)
def rotary_paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                           page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor, scale: float,
                           window: int, sinks: torch.Tensor | None, splits: torch.Tensor | None,
                           prefetch: torch.Tensor | None = None) -> torch.Tensor:
    """The CPU reference: the rotary cache write's body, then the attention reference."""
    check_rotary_paged_attention_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                      positions, sinks, splits, prefetch)
    rotated = rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
    return _reference_attention(rotated, k_cache, v_cache, page_table, query_start, positions, scale, window, sinks)


@rotary_paged_attention.register_fake
def _fake(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start, positions, scale, window, sinks,
          splits, prefetch=None):
    check_rotary_paged_attention_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                      positions, sinks, splits, prefetch)
    return q.new_empty(q.shape)


@rotary_paged_attention.register_kernel("cuda")
def _cuda(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start, positions, scale, window, sinks,
          splits, prefetch=None):
    check_rotary_paged_attention_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                      positions, sinks, splits, prefetch)
    return triton_rotary_paged_attention(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                         positions, scale, window, sinks, splits, prefetch=prefetch)


def triton_rotary_paged_attention(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                  positions, scale: float, window: int, sinks=None, splits=None, *,
                                  tile=None, prefetch=None, pdl: bool | None = None) -> torch.Tensor:
    """The CUDA body on validated arguments (CPU under TRITON_INTERPRET=1): one decode launch with the
    rotary prologue when T <= R, else the rotary kernel and the attention path of the op's variant.
    `tile` overrides the decode tile (benchmarks, tests) and `pdl` the choice of programmatic
    dependent launch (default: `helios.abi.triton_decode.takes_dependent_launch`)."""
    from helios.abi import triton_decode
    from helios.abi.triton_attention import triton_paged_attention, triton_paged_attention_tuned

    num_tokens = q.shape[0]
    if num_tokens == 0 or num_tokens > page_table.shape[0]:
        rotated = torch.ops.helios.rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
        if splits is None:
            return triton_paged_attention(rotated, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                          sinks=sinks)
        return triton_paged_attention_tuned(rotated, k_cache, v_cache, page_table, query_start, positions, scale,
                                            window, splits, sinks=sinks)
    q, k, v, cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, cos, sin))
    rotary = (k, v, cos, sin, slot_mapping)
    prefetch = prefetch if prefetch is None or prefetch.is_contiguous() else None  # a hint: a view is not fetched
    if splits is None:
        return triton_decode.paged_attention_decode(q, k_cache, v_cache, page_table, query_start, positions, scale,
                                                    window, sinks=sinks, tile=tile, rotary=rotary, prefetch=prefetch,
                                                    pdl=pdl)
    return triton_decode.paged_attention_decode_tuned(q, k_cache, v_cache, page_table, query_start, positions, scale,
                                                      window, splits, sinks=sinks, tile=tile, rotary=rotary,
                                                      prefetch=prefetch, pdl=pdl)
