"""Execution ABI: paged attention with an attention logit soft cap (namespace ``helios``).

Gemma 2's attention caps every scaled score before the mask and the softmax: with s_j = scale *
q.k_j, the weights are the softmax of ``tanh(s_j / softcap) * softcap`` over the visible positions.
Everything else is ``helios::paged_attention`` (see `helios.abi.attention`).

``helios::paged_attention_softcap(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table,
Tensor query_start, Tensor positions, float scale, int window, float softcap) -> Tensor``
    The arguments of ``helios::paged_attention`` plus softcap: finite and >= 0 (0: no cap, the
    result of ``helios::paged_attention``); a negative or non-finite cap is an `AbiArgumentError`.

``helios::paged_attention_softcap_tuned(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table,
Tensor query_start, Tensor positions, float scale, int window, float softcap, Tensor splits) -> Tensor``
    The same result; splits (int32 [1]) is the decode split schedule of
    ``helios::paged_attention_tuned``, read on the device (never a result).

Two ops rather than an argument of the existing ones, as for the sinks (`helios.abi.attention_sinks`):
a schema never changes once a core that uses it exists, and only a family with a cap calls these.
CPU bodies are the reference (`attention._reference_attention`); on CUDA they run the Triton kernels
of `helios.abi.triton_attention` with the cap compiled in (a constexpr: every other launch compiles
to the code it had). The capture-time rewrites of `helios.runtime.loading` (the fused rotary decode,
fresh-chunk attention) and the CPU fast paths match the uncapped ops only, so a capped call always
runs as itself.
"""

from __future__ import annotations

import math

import torch

from helios.abi.attention import _reference_attention, check_paged_attention_args, check_splits
from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError

__all__ = ["PAGED_ATTENTION_SOFTCAP_SCHEMA", "PAGED_ATTENTION_SOFTCAP_TUNED_SCHEMA", "check_softcap",
           "paged_attention_softcap", "paged_attention_softcap_tuned"]

PAGED_ATTENTION_SOFTCAP_SCHEMA = (
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor query_start, "
    "Tensor positions, float scale, int window, float softcap) -> Tensor"
)
PAGED_ATTENTION_SOFTCAP_TUNED_SCHEMA = (
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor query_start, "
    "Tensor positions, float scale, int window, float softcap, Tensor splits) -> Tensor"
)
_SOFTCAP, _SOFTCAP_TUNED = "helios::paged_attention_softcap", "helios::paged_attention_softcap_tuned"


def check_softcap(op: str, softcap: float) -> None:
    """Raise `AbiArgumentError` unless `softcap` is a finite number >= 0."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) \
            or softcap < 0:
        raise AbiArgumentError(f"{op}: softcap must be a finite number >= 0, got {softcap!r}")


def check_softcap_args(q, k_cache, v_cache, page_table, query_start, positions, softcap) -> None:
    """Metadata-only validation of ``helios::paged_attention_softcap`` (safe on fake tensors)."""
    check_paged_attention_args(q, k_cache, v_cache, page_table, query_start, positions)
    check_softcap(_SOFTCAP, softcap)


def check_softcap_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, softcap, splits) -> None:
    check_softcap_args(q, k_cache, v_cache, page_table, query_start, positions, softcap)
    check_splits(_SOFTCAP_TUNED, q, splits)


@abi_op(_SOFTCAP, mutates_args=(), schema=PAGED_ATTENTION_SOFTCAP_SCHEMA)
def paged_attention_softcap(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                            query_start: torch.Tensor, positions: torch.Tensor, scale: float, window: int,
                            softcap: float) -> torch.Tensor:
    check_softcap_args(q, k_cache, v_cache, page_table, query_start, positions, softcap)
    return _reference_attention(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                softcap=softcap)


@paged_attention_softcap.register_fake
def _softcap_fake(q, k_cache, v_cache, page_table, query_start, positions, scale, window, softcap):
    check_softcap_args(q, k_cache, v_cache, page_table, query_start, positions, softcap)
    return torch.empty_like(q)


@paged_attention_softcap.register_kernel("cuda")
def _softcap_cuda(q, k_cache, v_cache, page_table, query_start, positions, scale, window, softcap):
    check_softcap_args(q, k_cache, v_cache, page_table, query_start, positions, softcap)
    from helios.abi.triton_attention import triton_paged_attention

    return triton_paged_attention(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                  softcap=softcap)


@abi_op(_SOFTCAP_TUNED, mutates_args=(), schema=PAGED_ATTENTION_SOFTCAP_TUNED_SCHEMA)
def paged_attention_softcap_tuned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor,
                                  scale: float, window: int, softcap: float, splits: torch.Tensor) -> torch.Tensor:
    check_softcap_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, softcap, splits)
    return _reference_attention(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                softcap=softcap)


@paged_attention_softcap_tuned.register_fake
def _softcap_tuned_fake(q, k_cache, v_cache, page_table, query_start, positions, scale, window, softcap, splits):
    check_softcap_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, softcap, splits)
    return torch.empty_like(q)


@paged_attention_softcap_tuned.register_kernel("cuda")
def _softcap_tuned_cuda(q, k_cache, v_cache, page_table, query_start, positions, scale, window, softcap, splits):
    check_softcap_tuned_args(q, k_cache, v_cache, page_table, query_start, positions, softcap, splits)
    from helios.abi.triton_attention import triton_paged_attention_tuned

    return triton_paged_attention_tuned(q, k_cache, v_cache, page_table, query_start, positions, scale, window,
                                        splits, softcap=softcap)
