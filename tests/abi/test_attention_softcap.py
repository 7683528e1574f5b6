"""helios::paged_attention_softcap(_tuned): the CPU reference against a direct formula, argument checks,
and the Triton kernels (interpreted on the CPU, compiled with CUDA) against the reference.

The batches are those of test_triton_attention (poisoned caches: a kernel that reads outside a row's
context returns NaN). Scores there reach about +-6 (scale 0.3, head_dim 32), so a cap of 2 bends most
of them and decides which positions dominate.
"""

from __future__ import annotations

import math

import pytest
import torch

import test_triton_attention as base  # enables the interpreter on machines without CUDA first
from helios.abi import attention_softcap  # noqa: F401  (registers the ops)
from helios.abi.attention import AbiArgumentError
from helios.abi import triton_attention as kernels

from test_triton_attention import DECODE_CACHED, DECODE_LENS, MIXED_CACHED, MIXED_LENS, SCALE, Shape, make_batch

OPS = torch.ops.helios
CAP = 2.0


def reference(batch: base.Batch, window: int, softcap: float = CAP) -> torch.Tensor:
    k_cache, v_cache, table = batch.clean
    return OPS.paged_attention_softcap(batch.q, k_cache, v_cache, table, batch.query_start, batch.positions,
                                       SCALE, window, softcap)


def direct(batch: base.Batch, window: int, softcap: float) -> torch.Tensor:
    """Row by row, head by head, in float64: softmax(tanh(scale q.k / c) * c) over the visible positions."""
    out = torch.zeros_like(batch.q)
    for token, head, keys, values in base.visible_rows(batch, window):
        scores = torch.tanh(SCALE * keys @ batch.q[token, head].double() / softcap) * softcap
        out[token, head] = (torch.softmax(scores, 0) @ values).to(out.dtype)
    return out


def assert_kernel_matches(out: torch.Tensor, batch: base.Batch, window: int) -> None:
    assert out.dtype == batch.q.dtype and out.shape == batch.q.shape
    assert torch.all(out[batch.num_real_tokens:] == 0)
    torch.testing.assert_close(out, reference(batch, window), **base.TOLERANCE[batch.q.dtype])


@pytest.mark.parametrize("window", [0, 3])
def test_reference_is_the_softmax_of_the_capped_scores(window):
    batch = make_batch(31, [3, 1, 0, 2], [2, 9, 1, 5], padding=1)
    out = reference(batch, window)
    torch.testing.assert_close(out, direct(batch, window, CAP), rtol=1e-5, atol=1e-6)
    plain = base.reference(batch, window)
    real = batch.num_real_tokens
    assert (out[:real] - plain[:real]).abs().max() > 0.05  # the cap matters on these scores
    assert torch.equal(reference(batch, window, 0.0), plain)  # 0: no cap, the plain op's result
    torch.testing.assert_close(reference(batch, window, 1e6), plain, rtol=1e-5, atol=1e-5)  # far away: none bends


def test_decode_rows_use_the_batched_reference_path_too():
    batch = make_batch(32, DECODE_LENS, DECODE_CACHED)
    torch.testing.assert_close(reference(batch, 4), direct(batch, 4, CAP), rtol=1e-5, atol=1e-6)


def test_tuned_reference_ignores_the_split_count():
    batch = make_batch(33, DECODE_LENS, DECODE_CACHED)
    k_cache, v_cache, table = batch.clean
    tuned = OPS.paged_attention_softcap_tuned(batch.q, k_cache, v_cache, table, batch.query_start, batch.positions,
                                              SCALE, 0, CAP, torch.tensor([3], dtype=torch.int32))
    assert torch.equal(tuned, reference(batch, 0))


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -math.inf])
def test_a_negative_or_non_finite_cap_is_refused(bad):
    batch = make_batch(34, [1], [3])
    k_cache, v_cache, table = batch.clean
    with pytest.raises(AbiArgumentError, match="softcap"):
        OPS.paged_attention_softcap(batch.q, k_cache, v_cache, table, batch.query_start, batch.positions, SCALE, 0,
                                    bad)
    with pytest.raises(AbiArgumentError, match="softcap"):
        OPS.paged_attention_softcap_tuned(batch.q, k_cache, v_cache, table, batch.query_start, batch.positions,
                                          SCALE, 0, bad, torch.tensor([1], dtype=torch.int32))


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("window", [0, 5])
def test_decode_kernel_with_a_cap_across_splits(split, window):
    batch = make_batch(35, DECODE_LENS, DECODE_CACHED, Shape(page_tokens=4))
    out = base.run(kernels.triton_paged_attention, batch, window, split=split, softcap=CAP)
    assert_kernel_matches(out, batch, window)


@pytest.mark.parametrize("window", [0, 4])
def test_prefill_kernel_with_a_cap_on_a_mixed_batch(window):
    """Prompt chunks over cached prefix pages, a decoding lane and padding: every tile kind (below the
    window, wholly visible, diagonal) runs capped."""
    batch = make_batch(36, MIXED_LENS, MIXED_CACHED, Shape(page_tokens=4), padding=2)
    out = base.run(kernels.triton_paged_attention, batch, window, softcap=CAP)
    assert_kernel_matches(out, batch, window)


def test_prefill_kernel_with_a_cap_across_splits_and_bfloat16():
    batch = make_batch(37, [2, 3], [40, 70], Shape(page_tokens=4, dtype=torch.bfloat16))
    out = base.run(kernels.paged_attention_prefill, batch, 0, softcap=CAP, splits=3)
    assert_kernel_matches(out, batch, 0)


@pytest.mark.parametrize("count", [1, 5])
def test_tuned_decode_kernel_with_a_cap(count):
    batch = make_batch(38, [1, 1, 1], [5, 610, 1100], Shape(page_tokens=32))
    splits = torch.tensor([count], dtype=torch.int32, device=base.DEVICE)
    out = base.run(kernels.triton_paged_attention_tuned, batch, 700, splits=splits, softcap=CAP)
    assert_kernel_matches(out, batch, 700)


def test_softcap_ops_have_cuda_kernels_registered():
    for op in ("helios::paged_attention_softcap", "helios::paged_attention_softcap_tuned"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")
