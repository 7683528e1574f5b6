"""helios::paged_attention_chunked: the CPU reference against a direct formula, its argument checks, and its
Triton kernel (interpreted on the CPU, compiled with CUDA; compiled for sm_90 without a GPU) against the reference.

The batches are those of test_triton_attention (rows of several new tokens after cached ones on
shuffled pages, decode rows, padding). A query at position p sees the cached positions c <= p with
c // chunk == p // chunk (and inside a window where one is given too).
"""

from __future__ import annotations

import pytest
import torch

import test_triton_attention as base
from helios.abi import attention_chunked  # noqa: F401  (registers the op)
from helios.abi.attention import AbiArgumentError

from test_triton_attention import DECODE_CACHED, DECODE_LENS, MIXED_CACHED, MIXED_LENS, SCALE, make_batch

OPS = torch.ops.helios


def chunked(batch: base.Batch, window: int, chunk) -> torch.Tensor:
    k_cache, v_cache, table = batch.clean
    return OPS.paged_attention_chunked(batch.q, k_cache, v_cache, table, batch.query_start, batch.positions,
                                       SCALE, window, chunk)


def direct(batch: base.Batch, window: int, chunk: int) -> torch.Tensor:
    """Token by token, head by head, in float64: softmax(scale q.k) . v over the positions of the
    token's own chunk (within the window)."""
    k_cache, v_cache, table = batch.clean
    page_tokens, group = k_cache.shape[1], batch.q.shape[1] // k_cache.shape[2]
    out, bounds = torch.zeros_like(batch.q), batch.query_start.tolist()
    for row in range(len(bounds) - 1):
        for token in range(bounds[row], bounds[row + 1]):
            pos = int(batch.positions[token])
            seen = [c for c in range(pos - pos % chunk, pos + 1) if window <= 0 or pos - c < window]
            slots = torch.tensor([int(table[row, c // page_tokens]) * page_tokens + c % page_tokens for c in seen])
            for head in range(batch.q.shape[1]):
                keys = k_cache.view(-1, *k_cache.shape[2:])[slots, head // group].double()
                values = v_cache.view(-1, *v_cache.shape[2:])[slots, head // group].double()
                scores = SCALE * keys @ batch.q[token, head].double()
                out[token, head] = (torch.softmax(scores, 0) @ values).to(out.dtype)
    return out


@pytest.mark.parametrize("lens, cached, chunk, window", [
    (MIXED_LENS, MIXED_CACHED, 8, 0),  # prompt rows crossing chunk boundaries, decode rows among them
    (MIXED_LENS, MIXED_CACHED, 5, 3),  # a window inside the chunk limits the view further
    (DECODE_LENS, DECODE_CACHED, 7, 0),  # one query a row: the batched decode path
])
def test_reference_attends_within_each_querys_chunk(lens, cached, chunk, window):
    batch = make_batch(41, lens, cached, padding=1)
    out = chunked(batch, window, chunk)
    torch.testing.assert_close(out, direct(batch, window, chunk), rtol=1e-5, atol=1e-6)
    assert torch.all(out[batch.num_real_tokens:] == 0)
    plain = base.reference(batch, window)
    assert (out - plain).abs().max() > 0.05  # the chunk matters on these rows


def test_a_chunk_past_every_position_is_the_plain_op():
    batch = make_batch(42, MIXED_LENS, MIXED_CACHED)
    assert torch.equal(chunked(batch, 0, 1 << 20), base.reference(batch, 0))


@pytest.mark.parametrize("chunk", [0, -4])
def test_a_chunk_below_one_is_refused(chunk):
    batch = make_batch(43, DECODE_LENS, DECODE_CACHED)
    with pytest.raises(AbiArgumentError, match="chunk must be an integer >= 1"):
        chunked(batch, 0, chunk)


def test_the_host_plan_of_a_chunked_decode_group_is_the_torch_plan():
    from helios.abi.paged_reference import _group_host, _group_torch

    positions = torch.tensor([0, 7, 8, 13, 22])
    page_table = torch.randperm(30, generator=torch.Generator().manual_seed(44)).to(torch.int32).reshape(5, 6)
    host = _group_host(slice(0, 5), page_table, positions, 0, 30, 4, 8)
    torch_plan = _group_torch(slice(0, 5), page_table, positions, 0, 30, 4, 8)
    assert torch.equal(host.allowed, torch_plan.allowed) and torch.equal(host.mask, torch_plan.mask)
    assert host.allowed[3, 0, 0].nonzero().flatten().tolist() == [8, 9, 10, 11, 12, 13]


@pytest.mark.parametrize("lens, cached, chunk, window, shape", [
    (MIXED_LENS, MIXED_CACHED, 8, 0, base.Shape()),
    (MIXED_LENS, MIXED_CACHED, 5, 3, base.Shape(group=3, head_dim=24, page_tokens=4)),
    (DECODE_LENS, DECODE_CACHED, 16, 0, base.Shape(dtype=torch.bfloat16)),
])
def test_the_triton_kernel_matches_the_reference(lens, cached, chunk, window, shape):
    """Interpreted on the CPU, compiled on CUDA; on the poisoned batch (a read outside a token's
    chunk, its row's pages or the packed tokens would give NaN)."""
    from helios.abi.triton_chunked import triton_paged_attention_chunked

    batch = make_batch(45, lens, cached, shape, padding=2)
    out = base.run(triton_paged_attention_chunked, batch, window, chunk=chunk)
    assert torch.all(out[batch.num_real_tokens:] == 0)
    torch.testing.assert_close(out, chunked(batch, window, chunk), **base.TOLERANCE[shape.dtype])


# The compiler, stricter than the interpreter, accepts the kernel (PTX and ptxas, sm_90):
# test_kernels_compile_for_hopper (compile_chunked_kernels.py).


def test_the_op_has_a_cuda_kernel_registered():
    assert torch._C._dispatch_has_kernel_for_dispatch_key("helios::paged_attention_chunked", "CUDA")
