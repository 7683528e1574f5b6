"""Execution ABI: one layer's rotary cache write and causal attention over a fresh prompt chunk.

``helios::rotary_fresh_attention(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin,
Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, Tensor page_table, Tensor query_start,
Tensor positions, float scale, int window, Tensor? sinks, Tensor? splits) -> Tensor``
    Arguments as ``helios::rotary_paged_attention`` (`helios.abi.rotary_attention`), for a step whose
    packed tokens hold **one fresh chunk**: at most one row has tokens, they are packed tokens
    ``[0, n)`` (``query_start[0] == 0``), their positions are ``0 .. n - 1`` (no cached prefix), and
    the layer has no window (``window == 0``) and no sinks. Then the result equals the pair
    ``rotary_cache_write`` + paged attention: keys and values are written to the planes exactly as
    the rotary cache write writes them, and token i attends causally to the chunk's own rotated keys
    and values 0..i (which are the positions its cached view holds), computed from those fresh
    tensors instead of read back through the page table. Padding tokens (outside
    ``[query_start[0], query_start[R])``) get zeros. `page_table`, `positions` and `splits` are not
    read for the result; a step that breaks the precondition gets another result (the caller's
    contract: the runtime replays a program rewritten to this op only for steps that meet it).

Why: a cold prompt's prefill reads its own keys back from the paged cache, gathered page by page
when its pages are not consecutive; the fresh tensors are dense, so a fused attention kernel
(cuDNN's or FlashAttention's, through torch's ``scaled_dot_product_attention``) computes the same
causal attention without the page table. The precondition is a fact the host knows when it packs a
step (`helios.runtime.execution.program_variants.is_fresh_chunk`), so the choice is made by
replaying another CUDA graph, never on the device and never by compiling while serving.

Programs are not prepared with this op: the CUDA loader rewrites each (rotary cache write, attention)
pair of a long prefill program into it and captures that copy as a separate graph
(`helios.runtime.loading.fresh_calls`), so cores stay as they are. The CPU body computes the fresh
algorithm itself (torch's SDPA, causal, over the rotated q/k and v), so CPU tests compare it with
the paged reference; on CUDA, inputs no fused kernel takes (other than 16-bit, a head size over 256
or not a multiple of 8) run the paged pair, exact for any step.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from helios.abi.fused import apply_rotary
from helios.abi.attention import reference_cache_write
from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError
from helios.abi.rotary_attention import check_rotary_paged_attention_args

__all__ = ["FRESH_BACKENDS", "ROTARY_FRESH_ATTENTION_SCHEMA", "fresh_causal_attention", "rotary_fresh_attention",
           "takes_fused_kernel"]

ROTARY_FRESH_ATTENTION_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
    "Tensor slot_mapping, Tensor page_table, Tensor query_start, Tensor positions, float scale, int window, "
    "Tensor? sinks, Tensor? splits) -> Tensor"
)
_OP = "helios::rotary_fresh_attention"
# The SDPA backends the CUDA body allows, in priority order (torch takes the first that accepts the
# inputs). cuDNN first: on Hopper its fused attention is the fastest of torch's at 8B shapes, where
# FlashAttention-2 ran 167 us per layer at 2,048 cold tokens against the Triton prefill kernel's 102.6
# (bench/results/ttft_session1); bench/fresh_attention_ab.py times both against the paged kernel.
FRESH_BACKENDS: tuple[SDPBackend, ...] = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION)
_FUSED_DTYPES = (torch.bfloat16, torch.float16)


def check_rotary_fresh_attention_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                      positions, window, sinks, splits) -> None:
    """Metadata-only validation (safe on fake tensors): the rotary paged attention's checks, and no
    window or sinks (the fused kernels have neither)."""
    check_rotary_paged_attention_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                      positions, sinks, splits)
    if window != 0 or sinks is not None:
        raise AbiArgumentError(f"{_OP}: a fresh chunk's attention takes no window and no sinks")


def fresh_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                           backends: tuple[SDPBackend, ...] | None = None) -> torch.Tensor:
    """Causal attention of packed tokens q [T, Hq, D] over k, v [T, Hkv, D] (token i sees 0..i; GQA:
    query head h reads key/value head h // (Hq // Hkv)): [T, Hq, D] contiguous, q's dtype. Strided
    views are taken as they are (the last dimension contiguous). `backends` (on CUDA): the SDPA
    backends allowed, in priority order (default `FRESH_BACKENDS`); on the CPU torch's own choice."""
    heads = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    with _backends(q, backends):
        out = torch.nn.functional.scaled_dot_product_attention(*heads, is_causal=True, scale=scale,
                                                               enable_gqa=q.shape[1] != k.shape[1])
    return out.squeeze(0).transpose(0, 1).contiguous()  # the fused kernels write [T, Hq, D]: no copy


def _backends(q: torch.Tensor, backends):
    if not q.is_cuda:
        return contextlib.nullcontext()
    chosen = list(backends or FRESH_BACKENDS)
    try:
        return sdpa_kernel(chosen, set_priority=True)
    except TypeError:  # a torch without priorities: the backends allowed, in torch's order
        return sdpa_kernel(chosen)


def takes_fused_kernel(q: torch.Tensor) -> bool:
    """Whether the CUDA body's fused kernels take queries like `q` (static: dtype and head size)."""
    head_dim = q.shape[-1]
    return q.dtype in _FUSED_DTYPES and head_dim <= 256 and head_dim % 8 == 0


def _zero_outside_rows(out: torch.Tensor, query_start: torch.Tensor) -> torch.Tensor:
    """The CPU body's padding: zeros outside [query_start[0], query_start[R]) (read on the host)."""
    first, end = int(query_start[0]), int(query_start[-1])
    out[:first] = 0
    out[end:] = 0
    return out


@abi_op(_OP, mutates_args=("k_cache", "v_cache"), schema=ROTARY_FRESH_ATTENTION_SCHEMA)
def rotary_fresh_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                           page_table: torch.Tensor, query_start: torch.Tensor, positions: torch.Tensor, scale: float,
                           window: int, sinks: torch.Tensor | None, splits: torch.Tensor | None) -> torch.Tensor:
    """The CPU body: the rotary cache write's body, then causal SDPA over the rotated q, k and v."""
    check_rotary_fresh_attention_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                      positions, window, sinks, splits)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    reference_cache_write(k_cache, v_cache, k, v, slot_mapping)
    return _zero_outside_rows(fresh_causal_attention(q, k, v, scale), query_start)


@rotary_fresh_attention.register_fake
def _fake(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start, positions, scale, window, sinks,
          splits):
    check_rotary_fresh_attention_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                      positions, window, sinks, splits)
    return q.new_empty(q.shape)


@rotary_fresh_attention.register_kernel("cuda")
def _cuda(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start, positions, scale, window, sinks,
          splits):
    check_rotary_fresh_attention_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                      positions, window, sinks, splits)
    return cuda_rotary_fresh_attention(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start,
                                       positions, scale, splits)


def cuda_rotary_fresh_attention(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table, query_start, positions,
                                scale: float, splits=None, *, backends=None) -> torch.Tensor:
    """The CUDA body on validated arguments: the rotary kernel storing dense keys and values too, the fused
    causal attention over the fresh tensors, zeros for the padding tokens. Inputs no fused kernel
    takes (`takes_fused_kernel`) run the paged pair. `backends`: see `fresh_causal_attention`."""
    from helios.abi.rotary_attention import triton_rotary_paged_attention

    if q.shape[0] == 0 or not takes_fused_kernel(q) or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return triton_rotary_paged_attention(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, page_table,
                                             query_start, positions, scale, 0, None, splits)
    from helios.abi.triton_fused import triton_rotary_cache_write, triton_zero_outside_rows

    # dense [T, H, D] rotated q, k and v (the values the planes get): the fused kernels' favoured layout
    rotated_q, rotated_k, dense_v = triton_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping,
                                                              dense=True)
    out = fresh_causal_attention(rotated_q, rotated_k, dense_v, scale, backends)
    triton_zero_outside_rows(out, query_start)
    return out
