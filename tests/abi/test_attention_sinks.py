"""helios::paged_attention_sinks(_tuned): the CPU reference against a direct formula, argument checks,
and the Triton kernels (interpreted on the CPU, compiled with CUDA) against the reference.

The batches are those of test_triton_attention (poisoned caches: a kernel that reads outside a row's
context returns NaN). Sinks are drawn large enough (|z| up to ~6) to dominate some heads' softmax.
"""

from __future__ import annotations

import pytest
import torch

import test_triton_attention as base  # enables the interpreter on machines without CUDA first
from helios.abi import attention_sinks  # noqa: F401  (registers the ops)
from helios.abi.attention import AbiArgumentError
from helios.abi import triton_attention as kernels

from test_triton_attention import DECODE_CACHED, DECODE_LENS, MIXED_CACHED, MIXED_LENS, SCALE, Shape, make_batch

OPS = torch.ops.helios


def sinks_for(batch: base.Batch, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 2.0 * torch.randn(batch.q.shape[1], generator=generator)


def reference(batch: base.Batch, window: int, sinks: torch.Tensor) -> torch.Tensor:
    k_cache, v_cache, table = batch.clean
    return OPS.paged_attention_sinks(batch.q, k_cache, v_cache, table, batch.query_start, batch.positions,
                                     SCALE, window, sinks)


def direct(batch: base.Batch, window: int, sinks: torch.Tensor) -> torch.Tensor:
    """Row by row, head by head: softmax over [scores of visible positions, sink], sink column dropped."""
    out = torch.zeros_like(batch.q)
    for token, head, keys, values in base.visible_rows(batch, window):
        scores = SCALE * keys @ batch.q[token, head].double()
        weights = torch.softmax(torch.cat((scores, sinks[head].double().view(1))), 0)[:-1]
        out[token, head] = (weights @ values).to(out.dtype)
    return out


def assert_kernel_matches(out: torch.Tensor, batch: base.Batch, window: int, sinks: torch.Tensor) -> None:
    assert out.dtype == batch.q.dtype and out.shape == batch.q.shape
    assert torch.all(out[batch.num_real_tokens:] == 0)
    torch.testing.assert_close(out, reference(batch, window, sinks), **base.TOLERANCE[batch.q.dtype])


@pytest.mark.parametrize("window", [0, 3])
def test_reference_is_the_softmax_with_one_extra_logit_per_head(window):
    batch = make_batch(21, [3, 1, 0, 2], [2, 9, 1, 5], padding=1)
    sinks = sinks_for(batch, 1)
    out = reference(batch, window, sinks)
    torch.testing.assert_close(out, direct(batch, window, sinks), rtol=1e-5, atol=1e-6)
    plain = base.reference(batch, window)
    assert not torch.allclose(out[:batch.num_real_tokens], plain[:batch.num_real_tokens])
    very_negative = torch.full_like(sinks, -1e4)  # a sink that weighs nothing is plain attention
    torch.testing.assert_close(reference(batch, window, very_negative), plain)


def test_decode_rows_use_the_batched_reference_path_too():
    batch = make_batch(22, DECODE_LENS, DECODE_CACHED)
    sinks = sinks_for(batch, 2)
    torch.testing.assert_close(reference(batch, 4, sinks), direct(batch, 4, sinks), rtol=1e-5, atol=1e-6)


def test_tuned_reference_ignores_the_split_count():
    batch = make_batch(23, DECODE_LENS, DECODE_CACHED)
    sinks = sinks_for(batch, 3)
    k_cache, v_cache, table = batch.clean
    tuned = OPS.paged_attention_sinks_tuned(batch.q, k_cache, v_cache, table, batch.query_start, batch.positions,
                                            SCALE, 0, sinks, torch.tensor([3], dtype=torch.int32))
    assert torch.equal(tuned, reference(batch, 0, sinks))


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.zeros(4, dtype=torch.float64), torch.zeros(2, 2)])
def test_sinks_of_the_wrong_shape_or_dtype_are_refused(bad):
    batch = make_batch(24, [1], [3])
    k_cache, v_cache, table = batch.clean
    with pytest.raises(AbiArgumentError, match="sinks"):
        OPS.paged_attention_sinks(batch.q, k_cache, v_cache, table, batch.query_start, batch.positions, SCALE, 0,
                                  bad)


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("window", [0, 5])
def test_decode_kernel_with_sinks_across_splits(split, window):
    batch = make_batch(25, DECODE_LENS, DECODE_CACHED, Shape(page_tokens=4))
    sinks = sinks_for(batch, 4).to(base.DEVICE)
    out = base.run(kernels.triton_paged_attention, batch, window, split=split, sinks=sinks)
    assert_kernel_matches(out, batch, window, sinks.cpu())


@pytest.mark.parametrize("window", [0, 4])
def test_prefill_kernel_with_sinks_on_a_mixed_batch(window):
    batch = make_batch(26, MIXED_LENS, MIXED_CACHED, Shape(page_tokens=4), padding=2)
    sinks = sinks_for(batch, 5).to(base.DEVICE)
    out = base.run(kernels.triton_paged_attention, batch, window, sinks=sinks)
    assert_kernel_matches(out, batch, window, sinks.cpu())


@pytest.mark.parametrize("count", [1, 2, 5])
def test_tuned_decode_kernel_with_sinks_counts_each_sink_once(count):
    batch = make_batch(27, [1, 1, 1], [5, 610, 1100], Shape(page_tokens=32))
    sinks = sinks_for(batch, 6).to(base.DEVICE)
    splits = torch.tensor([count], dtype=torch.int32, device=base.DEVICE)
    out = base.run(kernels.triton_paged_attention_tuned, batch, 700, splits=splits, sinks=sinks)
    assert_kernel_matches(out, batch, 700, sinks.cpu())


def test_sinks_ops_have_cuda_kernels_registered():
    for op in ("helios::paged_attention_sinks", "helios::paged_attention_sinks_tuned"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")
