"""Execution ABI: paged attention within fixed chunks of positions (namespace ``helios``).

Chunked local attention (Llama 4's RoPE layers): the positions form consecutive chunks of ``chunk``
tokens, and a query at position p attends only to the cached positions c <= p of its own chunk,
c // chunk == p // chunk (equivalently c >= p - p % chunk). Everything else is
``helios::paged_attention`` (see `helios.abi.attention`); a window, when also given, limits the view
further.

``helios::paged_attention_chunked(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table,
Tensor query_start, Tensor positions, float scale, int window, int chunk) -> Tensor``
    The arguments of ``helios::paged_attention`` plus chunk: an integer >= 1 (a chunk below 1 is an
    `AbiArgumentError`: an unchunked layer calls ``helios::paged_attention``).

One op rather than an argument of the existing ones, as for the sinks and the soft cap: a schema
never changes once a core that uses it exists, and only a family with chunked layers calls it. The
CPU body is the reference (`attention._reference_attention`, whose plan masks each query's chunk);
on CUDA it runs the Triton kernel of `helios.abi.triton_chunked` (imported on first use), which
walks each token's span (at most one chunk) and never synchronises. There is no tuned variant: the
span is bounded by the chunk, so there is no split schedule to tune.
"""

from __future__ import annotations

import torch

from helios.abi.attention import _reference_attention, check_paged_attention_args
from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError

__all__ = ["PAGED_ATTENTION_CHUNKED_SCHEMA", "paged_attention_chunked"]

PAGED_ATTENTION_CHUNKED_SCHEMA = (
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor query_start, "
    "Tensor positions, float scale, int window, int chunk) -> Tensor"
)
_CHUNKED = "helios::paged_attention_chunked"


def check_chunked_args(q, k_cache, v_cache, page_table, query_start, positions, chunk) -> None:
    """Metadata-only validation of ``helios::paged_attention_chunked`` (safe on fake tensors)."""
    check_paged_attention_args(q, k_cache, v_cache, page_table, query_start, positions)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise AbiArgumentError(f"{_CHUNKED}: chunk must be an integer >= 1, got {chunk!r}")


@abi_op(_CHUNKED, mutates_args=(), schema=PAGED_ATTENTION_CHUNKED_SCHEMA)
def paged_attention_chunked(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                            query_start: torch.Tensor, positions: torch.Tensor, scale: float, window: int,
                            chunk: int) -> torch.Tensor:
    check_chunked_args(q, k_cache, v_cache, page_table, query_start, positions, chunk)
    return _reference_attention(q, k_cache, v_cache, page_table, query_start, positions, scale, window, chunk=chunk)


@paged_attention_chunked.register_fake
def _chunked_fake(q, k_cache, v_cache, page_table, query_start, positions, scale, window, chunk):
    check_chunked_args(q, k_cache, v_cache, page_table, query_start, positions, chunk)
    return torch.empty_like(q)


@paged_attention_chunked.register_kernel("cuda")
def _chunked_cuda(q, k_cache, v_cache, page_table, query_start, positions, scale, window, chunk):
    check_chunked_args(q, k_cache, v_cache, page_table, query_start, positions, chunk)
    from helios.abi.triton_chunked import triton_paged_attention_chunked

    return triton_paged_attention_chunked(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                          chunk)
