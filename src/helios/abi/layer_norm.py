"""Execution ABI: the mean-subtracted layer norm (namespace ``helios``), for the families whose norms
are LayerNorms rather than RMSNorms (Cohere's bias-free ``CohereLayerNorm``, StarCoder2's and
Phi's ``nn.LayerNorm`` with a bias).

``helios::layer_norm(Tensor x, Tensor weight, Tensor? bias, float eps) -> Tensor``
    Over the last dimension D, in float32 whatever x's dtype (Cohere's order):
    ``c = x32 - mean(x32)``, ``y = weight32 * (c * rsqrt(mean(c^2) + eps)) (+ bias32)``, cast to
    x's dtype; weight and bias [D] of one float dtype. Result: x's shape and dtype.

The CPU body is the reference. The CUDA kernel is the same torch composite for now (several
kernels; a fused Triton kernel like ``helios::rms_norm``'s would save launches), and no residual
fusion exists: a LayerNorm family adds its residual with a plain add before the norm.
"""

from __future__ import annotations

import torch

from helios.abi.op_library import AbiOp
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

__all__ = ["LAYER_NORM_SCHEMA", "layer_norm", "reference_layer_norm"]

LAYER_NORM_SCHEMA = "(Tensor x, Tensor weight, Tensor? bias, float eps) -> Tensor"
_OP = "helios::layer_norm"
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def reference_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The op's arithmetic; `weight` (and `bias`) may also be any shape that broadcasts against x
    (Cohere's per-head q/k norms: [heads, D] of x [T, heads, D]), which the op itself does not take."""
    x32 = x.to(torch.float32)
    centered = x32 - x32.mean(-1, keepdim=True)
    y = weight.to(torch.float32) * (centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps))
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def check_layer_norm_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    for name, tensor in (("x", x), ("weight", weight)) + ((("bias", bias),) if bias is not None else ()):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in _FLOAT_DTYPES or tensor.dim() < 1:
            raise AbiArgumentError(f"{_OP}: {name} must be a float32, bfloat16 or float16 tensor of rank >= 1")
    check_tensor(_OP, "weight", weight, weight.dtype, (x.shape[-1],))
    if bias is not None:
        check_tensor(_OP, "bias", bias, weight.dtype, (x.shape[-1],))
    check_same_device(_OP, dict(x=x, weight=weight) | ({"bias": bias} if bias is not None else {}))


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    check_layer_norm_args(x, weight, bias)
    return reference_layer_norm(x, weight, bias, eps)


def _layer_norm_fake(x, weight, bias, eps):
    check_layer_norm_args(x, weight, bias)
    return x.new_empty(x.shape)


def _layer_norm_cuda(x, weight, bias, eps):
    """The torch composite on the device (see the module docstring)."""
    check_layer_norm_args(x, weight, bias)
    return reference_layer_norm(x, weight, bias, eps)


_op = AbiOp(_OP, LAYER_NORM_SCHEMA, (), layer_norm)
_op.register_kernel("cuda")(_layer_norm_cuda)
_op.register_fake(_layer_norm_fake)
