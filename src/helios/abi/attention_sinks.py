"""Execution ABI: paged attention with attention sinks (namespace ``helios``).

An attention sink is one learned logit per query head that joins every softmax denominator and
contributes no value: with scores s_j = scale * q.k_j over the visible positions and sink logit z_h
of the query's head h, the weights are exp(s_j) / (sum_k exp(s_k) + exp(z_h)). The sink is not
scaled. Everything else is ``helios::paged_attention`` (see `helios.abi.attention`).

``helios::paged_attention_sinks(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table,
Tensor query_start, Tensor positions, float scale, int window, Tensor sinks) -> Tensor``
    The arguments of ``helios::paged_attention`` plus sinks: float32 [Hq] on q's device.

``helios::paged_attention_sinks_tuned(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table,
Tensor query_start, Tensor positions, float scale, int window, Tensor sinks, Tensor splits) -> Tensor``
    The same result; splits (int32 [1]) is the decode split schedule of
    ``helios::paged_attention_tuned``, read on the device (never a result).

Two ops rather than an optional input of the existing ones: a schema never changes once a core that
uses it exists. CPU bodies are the reference (`attention._reference_attention`); on CUDA they run
the Triton kernels of `helios.abi.triton_attention` with the sink folded into the online softmax.
"""

from __future__ import annotations

import torch

from helios.abi.attention import _reference_attention, check_paged_attention_args, check_splits
from helios.abi.op_library import abi_op
from helios.abi.registry import check_same_device, check_tensor

__all__ = ["PAGED_ATTENTION_SINKS_SCHEMA", "PAGED_ATTENTION_SINKS_TUNED_SCHEMA", "paged_attention_sinks",
           "paged_attention_sinks_tuned"]

PAGED_ATTENTION_SINKS_SCHEMA = (
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor query_start, "
    "Tensor positions, float scale, int window, Tensor sinks) -> Tensor"
)
PAGED_ATTENTION_SINKS_TUNED_SCHEMA = (
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor query_start, "
    "Tensor positions, float scale, int window, Tensor sinks, Tensor splits) -> Tensor"
)
_SINKS, _SINKS_TUNED = "helios::paged_attention_sinks", "helios::paged_attention_sinks_tuned"


def check_sinks_args(q, k_cache, v_cache, page_table, query_start, positions, sinks) -> None:
    """Metadata-only validation of ``helios::paged_attention_sinks`` (safe on fake tensors)."""
    check_paged_attention_args(q, k_cache, v_cache, page_table, query_start, positions)
    check_tensor(_SINKS, "sinks", sinks, torch.float32, (q.shape[1],))
    check_same_device(_SINKS, dict(q=q, sinks=sinks))


def check_sinks_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, sinks, splits) -> None:
    check_sinks_args(q, k_cache, v_cache, page_table, query_start, positions, sinks)
    check_splits(_SINKS_TUNED, q, splits)


@abi_op(_SINKS, mutates_args=(), schema=PAGED_ATTENTION_SINKS_SCHEMA)
def paged_attention_sinks(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                          query_start: torch.Tensor, positions: torch.Tensor, scale: float, window: int,
                          sinks: torch.Tensor) -> torch.Tensor:
    check_sinks_args(q, k_cache, v_cache, page_table, query_start, positions, sinks)
    return _reference_attention(q, k_cache, v_cache, page_table, query_start, positions, scale, window, sinks)


@paged_attention_sinks.register_fake
def _sinks_fake(q, k_cache, v_cache, page_table, query_start, positions, scale, window, sinks):
    check_sinks_args(q, k_cache, v_cache, page_table, query_start, positions, sinks)
    return torch.empty_like(q)


@paged_attention_sinks.register_kernel("cuda")
def _sinks_cuda(q, k_cache, v_cache, page_table, query_start, positions, scale, window, sinks):
    check_sinks_args(q, k_cache, v_cache, page_table, query_start, positions, sinks)
    from helios.abi.triton_attention import triton_paged_attention

    return triton_paged_attention(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                  sinks=sinks)


@abi_op(_SINKS_TUNED, mutates_args=(), schema=PAGED_ATTENTION_SINKS_TUNED_SCHEMA)
def paged_attention_sinks_tuned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                                scale: float, window: int, sinks: torch.Tensor,
                                splits: torch.Tensor) -> torch.Tensor:
    check_sinks_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, sinks, splits)
    return _reference_attention(q, k_cache, v_cache, page_table, query_start, positions, scale, window, sinks)


@paged_attention_sinks_tuned.register_fake
def _sinks_tuned_fake(q, k_cache, v_cache, page_table, query_start, positions, scale, window, sinks, splits):
    check_sinks_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, sinks, splits)
    return torch.empty_like(q)


@paged_attention_sinks_tuned.register_kernel("cuda")
def _sinks_tuned_cuda(q, k_cache, v_cache, page_table, query_start, positions, scale, window, sinks, splits):
    check_sinks_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, sinks, splits)
    from helios.abi.triton_attention import triton_paged_attention_tuned

    return triton_paged_attention_tuned(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                        splits, sinks=sinks)
