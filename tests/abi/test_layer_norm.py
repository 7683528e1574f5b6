"""``helios::layer_norm``: the references' LayerNorms on the CPU (Cohere's bias-free one bit for bit, and
``nn.LayerNorm`` with a bias), its dtype rules and argument checks, and its fake for export."""

from __future__ import annotations

import pytest
import torch

import helios.abi.layer_norm  # noqa: F401  (registers helios::layer_norm)
from helios.abi.registry import AbiArgumentError


def _inputs(dtype, width=24, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = (3 + 2 * torch.randn(5, width, generator=generator)).to(dtype)
    return x, 1 + 0.1 * torch.randn(width, generator=generator), 0.1 * torch.randn(width, generator=generator)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_it_is_cohere_layer_norm_bit_for_bit(dtype):
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm

    x, weight, _ = _inputs(dtype)
    norm = CohereLayerNorm(24, eps=1e-4)
    with torch.no_grad():
        norm.weight.copy_(weight)
        expected = norm(x)
    got = torch.ops.helios.layer_norm(x, weight, None, 1e-4)
    assert got.dtype == dtype and torch.equal(got, expected)


def test_with_a_bias_it_is_torch_layer_norm():
    """StarCoder2's and Phi's ``nn.LayerNorm`` (float32: the same values up to the reduction's rounding)."""
    x, weight, bias = _inputs(torch.float32, width=64, seed=1)
    expected = torch.nn.functional.layer_norm(x, (64,), weight, bias, 1e-5)
    torch.testing.assert_close(torch.ops.helios.layer_norm(x, weight, bias, 1e-5), expected, rtol=1e-6, atol=1e-6)
    heads = x.reshape(5, 4, 16)  # any leading shape: normed over the last dimension
    got = torch.ops.helios.layer_norm(heads, weight[:16], bias[:16], 1e-5)
    torch.testing.assert_close(got, torch.nn.functional.layer_norm(heads, (16,), weight[:16], bias[:16], 1e-5),
                               rtol=1e-6, atol=1e-6)


def test_bad_arguments_are_refused_and_the_fake_gives_the_shape():
    x, weight, bias = _inputs(torch.float32)
    with pytest.raises(AbiArgumentError, match="weight"):
        torch.ops.helios.layer_norm(x, weight[:8], None, 1e-5)
    with pytest.raises(AbiArgumentError, match="bias"):
        torch.ops.helios.layer_norm(x, weight, bias[:8], 1e-5)
    with pytest.raises(AbiArgumentError, match="x"):
        torch.ops.helios.layer_norm(x.to(torch.int64), weight, None, 1e-5)
    meta = torch.ops.helios.layer_norm(x.to("meta", torch.bfloat16), weight.to("meta"), None, 1e-5)
    assert meta.shape == x.shape and meta.dtype == torch.bfloat16
