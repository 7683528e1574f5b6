"""``helios::rotary_fresh_attention`` (`helios.abi.fresh_attention`): on a step of one fresh prompt chunk
(tokens [0, n) at positions 0..n-1, padding after them) it writes the planes exactly as the rotary
cache write does and its causal attention over the fresh tensors equals the paged reference's; its
arguments are checked with typed errors; the kernels it adds (the rotary kernel storing the rotated
keys, the padding zeros) agree with the reference, interpreted on the CPU, compiled on CUDA.
"""

from __future__ import annotations

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi import fresh_attention, fused  # noqa: E402,F401
from helios.abi.registry import AbiArgumentError  # noqa: E402
from helios.abi.triton_fused import triton_rotary_cache_write, triton_zero_outside_rows  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
OPS = torch.ops.helios
HEADS, KV_HEADS, DIM, PAGE_TOKENS, PAGES = 8, 2, 16, 4, 16


def fresh_case(num_tokens: int, live: int, dtype=torch.float32, rows: int = 2, seed: int = 0):
    """(q, k, v, cos, sin, k_cache, v_cache, slots, page_table, query_start, positions): one row of
    `live` fresh tokens from position 0 over shuffled pages, then padding; q, k, v strided views of
    one fused projection; the other rows empty."""
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, (HEADS + 2 * KV_HEADS) * DIM, generator=generator).to(dtype)
    q, k, v = (t.reshape(num_tokens, -1, DIM) for t in qkv.split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], -1))
    positions = torch.cat([torch.arange(live), torch.zeros(num_tokens - live, dtype=torch.int64)])
    angles = positions[:, None].float() * (1.0 / 10000 ** (torch.arange(0, DIM, 2).float() / DIM))
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None]
    pages = -(-live // PAGE_TOKENS)
    page_table = torch.zeros(rows, pages + 1, dtype=torch.int32)
    page_table[0, :pages] = torch.randperm(PAGES, generator=generator)[:pages].to(torch.int32)
    slots = page_table[0][positions // PAGE_TOKENS].long() * PAGE_TOKENS + positions % PAGE_TOKENS
    slots[live:] = -1
    query_start = torch.tensor([0] + [live] * rows, dtype=torch.int32)
    cache = torch.randn(PAGES, PAGE_TOKENS, KV_HEADS, DIM, generator=generator).to(dtype)
    return q, k, v, cos, sin, cache, cache.clone() * 2, slots, page_table, query_start, positions


def _on(device, case):
    return tuple(t.to(device) for t in case)


@pytest.mark.parametrize("num_tokens, live", [(24, 24), (24, 17), (9, 1)])
def test_a_fresh_chunk_attends_as_the_paged_reference(num_tokens, live):
    case = fresh_case(num_tokens, live)
    fresh_planes, paged_planes = (case[5].clone(), case[6].clone()), (case[5].clone(), case[6].clone())
    fresh = OPS.rotary_fresh_attention(*case[:5], *fresh_planes, *case[7:], 0.3, 0, None, None)
    paged = OPS.rotary_paged_attention(*case[:5], *paged_planes, *case[7:], 0.3, 0, None, None)
    torch.testing.assert_close(fresh, paged, rtol=1e-5, atol=1e-5)
    assert torch.equal(fresh_planes[0], paged_planes[0]) and torch.equal(fresh_planes[1], paged_planes[1])
    assert fresh.is_contiguous() and bool((fresh[live:] == 0).all())


def test_a_cached_prefix_breaks_the_precondition():
    """The op's result is the paged one only for fresh chunks: a chunk after a cached prefix differs
    (what the runtime's `is_fresh_chunk` keeps such steps from)."""
    q, k, v, cos, sin, k_cache, v_cache, slots, page_table, query_start, positions = fresh_case(12, 12)
    shifted = positions + 4  # the same chunk after 4 cached positions
    slots = page_table[0][shifted // PAGE_TOKENS].long() * PAGE_TOKENS + shifted % PAGE_TOKENS
    args = (q, k, v, cos, sin)
    paged = OPS.rotary_paged_attention(*args, k_cache.clone(), v_cache.clone(), slots, page_table, query_start,
                                       shifted, 0.3, 0, None, None)
    fresh = OPS.rotary_fresh_attention(*args, k_cache.clone(), v_cache.clone(), slots, page_table, query_start,
                                       shifted, 0.3, 0, None, None)
    assert not torch.allclose(fresh, paged, atol=1e-3)


def test_windows_sinks_and_bad_tensors_are_typed_errors():
    case = fresh_case(8, 8)
    with pytest.raises(AbiArgumentError, match="window"):
        OPS.rotary_fresh_attention(*case, 0.3, 4, None, None)
    with pytest.raises(AbiArgumentError, match="sinks"):
        OPS.rotary_fresh_attention(*case, 0.3, 0, torch.zeros(HEADS), None)
    with pytest.raises(AbiArgumentError, match="positions"):
        OPS.rotary_fresh_attention(*case[:10], case[10][:5], 0.3, 0, None, None)
    with pytest.raises(AbiArgumentError, match="cos"):
        OPS.rotary_fresh_attention(*case[:3], case[3][:, 0], *case[4:], 0.3, 0, None, None)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_the_rotary_kernel_stores_dense_keys_and_values(dtype):
    q, k, v, cos, sin, k_cache, v_cache, slots, *_ = _on(DEVICE, fresh_case(10, 7, dtype))
    planes = (k_cache.clone(), v_cache.clone())
    rotated_q = triton_rotary_cache_write(q, k, v, cos, sin, *planes, slots)
    pair_q, rotated_k, dense_v = triton_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slots, dense=True)
    assert torch.equal(pair_q, rotated_q)  # the same kernel, the same values
    assert torch.equal(k_cache, planes[0]) and torch.equal(v_cache, planes[1])
    assert rotated_k.shape == k.shape and rotated_k.is_contiguous() and dense_v.is_contiguous()
    assert torch.equal(dense_v, v)
    written = slots >= 0
    assert torch.equal(k_cache.reshape(-1, KV_HEADS, DIM)[slots[written]], rotated_k[written])
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(rotated_k.cpu(), fused.apply_rotary(k, cos, sin).cpu(), **tolerance)


@pytest.mark.parametrize("bounds", [(0, 37), (0, 0), (5, 40), (0, 40), (16, 32)])
def test_padding_zeros_leave_the_rows(bounds):
    out = torch.randn(40, 3, 300, device=DEVICE) + 5
    before = out.clone()
    triton_zero_outside_rows(out, torch.tensor([bounds[0], bounds[1], bounds[1]], dtype=torch.int32, device=DEVICE))
    inside = torch.zeros(40, dtype=torch.bool, device=DEVICE)
    inside[bounds[0]:bounds[1]] = True
    assert torch.equal(out[inside], before[inside]) and bool((out[~inside] == 0).all())


def test_the_fused_kernels_take_16_bit_heads_only():
    assert fresh_attention.takes_fused_kernel(torch.empty(4, 8, 128, dtype=torch.bfloat16))
    assert fresh_attention.takes_fused_kernel(torch.empty(4, 8, 64, dtype=torch.float16))
    assert not fresh_attention.takes_fused_kernel(torch.empty(4, 8, 128))
    assert not fresh_attention.takes_fused_kernel(torch.empty(4, 8, 12, dtype=torch.bfloat16))


def test_the_op_has_a_cuda_kernel_registered():
    assert torch._C._dispatch_has_kernel_for_dispatch_key("helios::rotary_fresh_attention", "CUDA")
