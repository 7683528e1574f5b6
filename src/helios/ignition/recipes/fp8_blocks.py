"""Block-quantized float8 checkpoints (DeepSeek-V3's format), dequantized at prepare.

A checkpoint whose config declares ``quantization_config`` with ``quant_method: "fp8"`` stores some
linear weights as ``float8_e4m3fn`` beside a ``<name>_scale_inv`` tensor of one float32 scale per
block of ``weight_block_size`` = [rows, columns] (128 x 128 in DeepSeek-V3): the real weight is

    W[i, j] = float32(Wq[i, j]) * scale_inv[i // rows, j // columns]

with ``scale_inv`` of shape [ceil(out / rows), ceil(in / columns)] (the last blocks of a dimension
that the block does not divide are partial). `BlockFp8Tensors` wraps `CheckpointTensors` so that
recipes see only the dequantized weights: ``get`` of a quantized weight returns that product in
float32 (exact: a float8 value times a float32 scale is rounded once, as in float64 then float32),
which the recipe casts to the core's dtype like any weight; the scale tensors are hidden from
``names``. Activations are not quantized (the served model computes in the core's dtype).

Everything is validated from the safetensors headers before a weight is read: a quantized weight
without its scales, scales without a quantized weight, scales of the wrong shape, a malformed block
size, a float8 format other than e4m3 or static activation scales each raise `QuantizationError`
(a `CheckpointError`) naming the tensor; another ``quant_method`` raises `UnsupportedCheckpoint`.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from helios.ignition.architecture import CheckpointError
from helios.ignition.recipes.base import UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import CheckpointTensors

__all__ = ["BlockFp8Tensors", "QuantizationError", "dequantize_blocks", "tensors_for_config"]

SCALE_SUFFIX = "_scale_inv"
_FP8 = "F8_E4M3"
_SCALE_DTYPES = ("F32", "BF16", "F16")


class QuantizationError(CheckpointError):
    """A quantized checkpoint whose quantization tensors or settings are malformed."""


def tensors_for_config(config: Mapping[str, Any], tensors: CheckpointTensors):
    """`tensors` as the recipe should read them: unchanged without ``quantization_config``, through
    `BlockFp8Tensors` for block fp8; other quantization methods are refused."""
    settings = config.get("quantization_config")
    if settings is None:
        return tensors
    if not isinstance(settings, Mapping):
        raise QuantizationError("quantization_config must be an object")
    method = settings.get("quant_method")
    if method != "fp8":
        raise UnsupportedCheckpoint(f"quantization method {method!r} is not supported (only block 'fp8')")
    return BlockFp8Tensors(tensors, block_size(settings))


def block_size(settings: Mapping[str, Any]) -> tuple[int, int]:
    fmt = settings.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise QuantizationError(f"fp8 format {fmt!r} is not supported (only 'e4m3', float8_e4m3fn)")
    if settings.get("activation_scheme", "dynamic") != "dynamic":
        raise QuantizationError(f"activation_scheme {settings.get('activation_scheme')!r} is not supported "
                                "(only 'dynamic': no stored activation scales)")
    block = settings.get("weight_block_size")
    if (not isinstance(block, (list, tuple)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise QuantizationError(f"weight_block_size must be two positive integers [rows, columns], got {block!r}")
    return int(block[0]), int(block[1])


def dequantize_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float32 weight of a float8 [out, in] weight and its [ceil(out/rows), ceil(in/columns)] scales."""
    rows, columns = block
    out_dim, in_dim = weight.shape
    scales = scale_inv.to(torch.float32).repeat_interleave(rows, 0).repeat_interleave(columns, 1)
    return weight.to(torch.float32) * scales[:out_dim, :in_dim]


class BlockFp8Tensors:
    """The read interface of `CheckpointTensors` with block-fp8 weights dequantized (module docstring)."""

    def __init__(self, tensors: CheckpointTensors, block: tuple[int, int]):
        self._tensors = tensors
        self._block = block
        self._quantized = self._validated()
        self._names = frozenset(name for name in tensors.names if not name.endswith(SCALE_SUFFIX))

    @property
    def names(self) -> frozenset[str]:
        return self._names

    @property
    def quantized(self) -> frozenset[str]:
        """The weights stored in float8 (dequantized on read)."""
        return self._quantized

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def get(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise CheckpointError(f"the checkpoint has no tensor {name}")
        if name not in self._quantized:
            return self._tensors.get(name)
        return dequantize_blocks(self._tensors.get(name), self._tensors.get(name + SCALE_SUFFIX), self._block)

    def _validated(self) -> frozenset[str]:
        names = self._tensors.names
        quantized = set()
        for name in sorted(names):
            dtype, shape = self._tensors.header(name)
            if name.endswith(SCALE_SUFFIX):
                weight = name[:-len(SCALE_SUFFIX)]
                if weight not in names or self._tensors.header(weight)[0] != _FP8:
                    raise QuantizationError(f"{name} scales no float8 weight {weight}")
                continue
            if dtype != _FP8:
                continue
            if name + SCALE_SUFFIX not in names:
                raise QuantizationError(f"float8 weight {name} has no {name + SCALE_SUFFIX} block scales")
            self._check_scales(name, shape)
            quantized.add(name)
        return frozenset(quantized)

    def _check_scales(self, name: str, shape: tuple[int, ...]) -> None:
        scale_dtype, scale_shape = self._tensors.header(name + SCALE_SUFFIX)
        if len(shape) != 2:
            raise QuantizationError(f"float8 weight {name} has shape {list(shape)}; block scales need a matrix")
        rows, columns = self._block
        expected = (-(-shape[0] // rows), -(-shape[1] // columns))
        if tuple(scale_shape) != expected:
            raise QuantizationError(
                f"{name + SCALE_SUFFIX} has shape {list(scale_shape)}; weight {list(shape)} in blocks of "
                f"{rows} x {columns} needs {list(expected)}")
        if scale_dtype not in _SCALE_DTYPES:
            raise QuantizationError(f"{name + SCALE_SUFFIX} is {scale_dtype}; block scales are floating point")
