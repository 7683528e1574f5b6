"""Execution ABI: fused elementwise ops of the dense decoder (namespace ``helios``).

Each op is one kernel on CUDA (`helios.abi.triton_fused`, imported on first use) where the plain
torch form is several: a decode step at batch 1 spends most of its time launching small kernels.
The CPU bodies are the reference: exactly the torch ops the decoder ran before these ops existed,
in the same order, so CPU float32 results are bit for bit what they were. The CUDA kernels round
where the reference rounds (to the tensor dtype after each torch op), so bfloat16 results agree
with the reference to within the last bit of a reduction's order; nothing on either path reads
device data on the host, so programs calling them are export- and CUDA-graph-capturable.

``helios::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor``
    Hugging Face order over the last dimension D: ``y = weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)``
    with x32 = x in float32; weight [D]. Result: x's shape, dtype ``promote(weight, x)``.

``helios::add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)``
    The residual update and the next norm: ``s = x + delta`` (in x's dtype) and ``rms_norm(s)``;
    x and delta [N, D] of one dtype. Returns (s, normed).

``helios::silu_mul(Tensor gate_up) -> Tensor``
    gate_up [N, 2F] (gate columns, then up columns): ``silu(gate) * up`` [N, F] in its dtype.

``helios::gelu_tanh_mul(Tensor gate_up) -> Tensor``
    As ``silu_mul`` with the tanh-approximated GELU (Gemma's ``gelu_pytorch_tanh``):
    ``gelu(gate, approximate="tanh") * up`` [N, F] in its dtype. Its CUDA kernel is the same torch
    composite (two kernels: the activation, then the product); no loader rewrite matches it.

``helios::rotary_cache_write(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin,
Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> Tensor``
    Rotary embedding on [cos, sin] halves (``x * cos + rotate_half(x) * sin``) of q [T, Hq, D] and
    k [T, Hkv, D], then ``helios::cache_write`` of the rotated k and of v (see
    `helios.abi.attention`: negative slots skipped). cos, sin [T, 1, D] in q's dtype. q, k, v may
    be strided views (the split of a fused qkv projection). Returns the rotated q, contiguous;
    k_cache and v_cache are mutated in place.
"""

from __future__ import annotations

import torch

import helios.abi.attention  # noqa: F401  (registers helios::cache_write, which the reference calls)
from helios.abi.attention import check_cache_write_args, reference_cache_write
from helios.abi.op_library import AbiOp
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

__all__ = ["RMS_NORM_SCHEMA", "ADD_RMS_NORM_SCHEMA", "SILU_MUL_SCHEMA", "GELU_TANH_MUL_SCHEMA",
           "ROTARY_CACHE_WRITE_SCHEMA", "apply_rotary", "reference_rms_norm", "add_rms_norm", "rms_norm",
           "rotary_cache_write", "silu_mul", "gelu_tanh_mul"]

RMS_NORM_SCHEMA = "(Tensor x, Tensor weight, float eps) -> Tensor"
ADD_RMS_NORM_SCHEMA = "(Tensor x, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)"
SILU_MUL_SCHEMA = "(Tensor gate_up) -> Tensor"
GELU_TANH_MUL_SCHEMA = "(Tensor gate_up) -> Tensor"
ROTARY_CACHE_WRITE_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
    "Tensor slot_mapping) -> Tensor"
)
_NORM, _ADD_NORM, _SILU, _ROTARY = ("helios::rms_norm", "helios::add_rms_norm", "helios::silu_mul",
                                    "helios::rotary_cache_write")
_GELU = "helios::gelu_tanh_mul"
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _check_float(op: str, name: str, tensor: object) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in _FLOAT_DTYPES or tensor.dim() < 1:
        raise AbiArgumentError(f"{op}: {name} must be a float32, bfloat16 or float16 tensor of rank >= 1")


def check_rms_norm_args(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    _check_float(op, "x", x)
    _check_float(op, "weight", weight)
    check_tensor(op, "weight", weight, weight.dtype, (x.shape[-1],))
    check_same_device(op, dict(x=x, weight=weight))


def _uses_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.dtype == weight.dtype and x.numel() > 0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    check_rms_norm_args(_NORM, x, weight)
    return reference_rms_norm(x, weight, eps)


def _rms_norm_fake(x, weight, eps):
    check_rms_norm_args(_NORM, x, weight)
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


def _rms_norm_cuda(x, weight, eps):
    check_rms_norm_args(_NORM, x, weight)
    if not _uses_kernel(x, weight):
        return reference_rms_norm(x, weight, eps)
    from helios.abi.triton_fused import triton_rms_norm

    return triton_rms_norm(x, None, weight, eps)[1]


def check_add_rms_norm_args(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor) -> None:
    check_rms_norm_args(_ADD_NORM, x, weight)
    check_tensor(_ADD_NORM, "delta", delta, x.dtype, tuple(x.shape))
    check_same_device(_ADD_NORM, dict(x=x, delta=delta))


def reference_add_rms_norm(x, delta, weight, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x + delta
    return summed, reference_rms_norm(summed, weight, eps)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    check_add_rms_norm_args(x, delta, weight)
    return reference_add_rms_norm(x, delta, weight, eps)


def _add_rms_norm_fake(x, delta, weight, eps):
    check_add_rms_norm_args(x, delta, weight)
    return x.new_empty(x.shape), x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


def _add_rms_norm_cuda(x, delta, weight, eps):
    check_add_rms_norm_args(x, delta, weight)
    if not _uses_kernel(x, weight):
        return reference_add_rms_norm(x, delta, weight, eps)
    from helios.abi.triton_fused import triton_rms_norm

    return triton_rms_norm(x, delta, weight, eps)


def check_silu_mul_args(gate_up: torch.Tensor, op: str = _SILU) -> int:
    """Validate gate_up [N, 2F] (of `op`, a gated activation); return F."""
    _check_float(op, "gate_up", gate_up)
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise AbiArgumentError(f"{op}: gate_up must be [N, 2F], got {list(gate_up.shape)}")
    return gate_up.shape[1] // 2


def reference_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.split([gate_up.shape[1] // 2] * 2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    check_silu_mul_args(gate_up)
    return reference_silu_mul(gate_up)


def _silu_mul_fake(gate_up):
    width = check_silu_mul_args(gate_up)
    return gate_up.new_empty((gate_up.shape[0], width))


def _silu_mul_cuda(gate_up):
    check_silu_mul_args(gate_up)
    if gate_up.numel() == 0:
        return reference_silu_mul(gate_up)
    from helios.abi.triton_fused import triton_silu_mul

    return triton_silu_mul(gate_up)


def reference_gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.split([gate_up.shape[1] // 2] * 2, dim=-1)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    check_silu_mul_args(gate_up, _GELU)
    return reference_gelu_tanh_mul(gate_up)


def _gelu_tanh_mul_fake(gate_up):
    width = check_silu_mul_args(gate_up, _GELU)
    return gate_up.new_empty((gate_up.shape[0], width))


def _gelu_tanh_mul_cuda(gate_up):
    """The torch composite on the device (a Triton kernel like `triton_silu_mul`'s would save a launch)."""
    check_silu_mul_args(gate_up, _GELU)
    return reference_gelu_tanh_mul(gate_up)


def check_rotary_cache_write_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping) -> None:
    """Metadata-only validation of ``helios::rotary_cache_write`` (safe on fake tensors)."""
    check_cache_write_args(k_cache, v_cache, k, v, slot_mapping)
    head_dim = k_cache.shape[3]
    check_tensor(_ROTARY, "q", q, k_cache.dtype, (k.shape[0], None, head_dim))
    check_tensor(_ROTARY, "cos", cos, q.dtype, (q.shape[0], 1, head_dim))
    check_tensor(_ROTARY, "sin", sin, q.dtype, (q.shape[0], 1, head_dim))
    check_same_device(_ROTARY, dict(q=q, k=k, cos=cos, sin=sin))


def reference_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping) -> torch.Tensor:
    """The decoder's former sequence: rotate q and k, write k and v (the cache_write op, whose
    CUDA path is capturable); returns the rotated q."""
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    torch.ops.helios.cache_write(k_cache, v_cache, k, v, slot_mapping)
    return q.contiguous()


def rotary_cache_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slot_mapping: torch.Tensor) -> torch.Tensor:
    """The CPU body: `reference_rotary_cache_write`, with the (validated) cache write's CPU body
    called directly rather than through the dispatcher (the same writes)."""
    check_rotary_cache_write_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    reference_cache_write(k_cache, v_cache, k, v, slot_mapping)
    return q.contiguous()


def _rotary_cache_write_fake(q, k, v, cos, sin, k_cache, v_cache, slot_mapping):
    check_rotary_cache_write_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
    return q.new_empty(q.shape)


def _rotary_cache_write_cuda(q, k, v, cos, sin, k_cache, v_cache, slot_mapping):
    check_rotary_cache_write_args(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or q.shape[0] == 0:
        return reference_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)
    from helios.abi.triton_fused import triton_rotary_cache_write

    return triton_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slot_mapping)


for _name, _schema, _mutated, _body, _cuda, _fake in (
    ("rms_norm", RMS_NORM_SCHEMA, (), rms_norm, _rms_norm_cuda, _rms_norm_fake),
    ("add_rms_norm", ADD_RMS_NORM_SCHEMA, (), add_rms_norm, _add_rms_norm_cuda, _add_rms_norm_fake),
    ("silu_mul", SILU_MUL_SCHEMA, (), silu_mul, _silu_mul_cuda, _silu_mul_fake),
    ("gelu_tanh_mul", GELU_TANH_MUL_SCHEMA, (), gelu_tanh_mul, _gelu_tanh_mul_cuda, _gelu_tanh_mul_fake),
    ("rotary_cache_write", ROTARY_CACHE_WRITE_SCHEMA, ("k_cache", "v_cache"), rotary_cache_write,
     _rotary_cache_write_cuda, _rotary_cache_write_fake),
):
    _op = AbiOp(f"helios::{_name}", _schema, _mutated, _body)
    _op.register_kernel("cuda")(_cuda)
    _op.register_fake(_fake)
