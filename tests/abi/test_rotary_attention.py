"""``helios::rotary_paged_attention``: the decode kernel with its rotary prologue against the two-kernel
sequence it replaces (``helios::rotary_cache_write``'s kernel, then the decode kernel on the rotated
q), outputs and cache planes (bit for bit under the interpreter, within the GPU tolerance on CUDA),
and against the CPU reference op. Without CUDA the kernels
run under Triton's interpreter (test_triton_attention enables it first); batches are the poisoned
ones of test_triton_attention (a kernel that reads outside a row's context returns NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import test_triton_attention as base  # enables the interpreter on machines without CUDA first
from helios.abi import rotary_attention  # noqa: F401  (registers the op)
from helios.abi import triton_decode as decode
from helios.abi.registry import AbiArgumentError
from helios.abi.rotary_attention import triton_rotary_paged_attention
from helios.abi.triton_fused import triton_rotary_cache_write
from test_triton_attention import DEVICE, SCALE, Shape, make_batch

OPS = torch.ops.helios
RAGGED = [0, 3, 17, 40, 70]


@dataclass(frozen=True)
class Step:
    """A batch's new tokens: q, k, v as views of one fused product, rotary tables, their slots."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor


def make_step(seed: int, batch: base.Batch, shape: Shape, padding_slot: int = -1) -> Step:
    """New keys and values for every packed token of `batch`, written at its position's slot (a
    padding token at `padding_slot`), q/k/v strided views of one [T, (Hq + 2 Hkv) D] product."""
    generator = torch.Generator().manual_seed(seed)
    num_tokens, num_heads, dim = batch.q.shape
    kv = shape.num_kv_heads * dim
    fused = torch.randn(num_tokens, num_heads * dim + 2 * kv, generator=generator).to(shape.dtype)
    q, k, v = fused.split([num_heads * dim, kv, kv], dim=-1)
    q = q.reshape(num_tokens, num_heads, dim)
    k, v = (t.reshape(num_tokens, shape.num_kv_heads, dim) for t in (k, v))
    angles = batch.positions[:, None].float() * torch.rand(dim // 2, generator=generator)[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = (t.to(shape.dtype)[:, None, :] for t in (angles.cos(), angles.sin()))
    table, page_tokens = batch.clean[2], shape.page_tokens
    slots = torch.full((num_tokens,), padding_slot, dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(table.shape[0]), batch.query_start.diff().long())
    for token, row in enumerate(rows.tolist()):
        position = int(batch.positions[token])
        slots[token] = int(table[row, position // page_tokens]) * page_tokens + position % page_tokens
    return Step(q, k, v, cos, sin, slots)


def spare_page(batch: base.Batch, contexts: list[int], page_tokens: int) -> int:
    """A page of the clean planes that no row holds and that is not the poison page (the last)."""
    table = batch.clean[2]
    held = {int(table[row, page]) for row, context in enumerate(contexts) for page in range(-(-context // page_tokens))}
    return min(set(range(batch.clean[0].shape[0] - 1)) - held)


def _on_device(step: Step, batch: base.Batch):
    k_cache, v_cache, table = (t.to(DEVICE).clone() for t in batch.poisoned)
    tensors = [t.to(DEVICE) for t in (step.q, step.k, step.v, step.cos, step.sin)]
    if DEVICE != "cpu":  # q/k/v views of one product on the device too
        num_heads, dim = step.q.shape[1:]
        fused = torch.cat([t.reshape(t.shape[0], -1) for t in (step.q, step.k, step.v)], dim=-1).to(DEVICE)
        q, k, v = fused.split([num_heads * dim, step.k[0].numel(), step.v[0].numel()], dim=-1)
        tensors[:3] = q.reshape(step.q.shape), k.reshape(step.k.shape), v.reshape(step.v.shape)
    geometry = (table, batch.query_start.to(DEVICE), batch.positions.to(DEVICE))
    return tensors, (k_cache, v_cache), geometry, step.slots.to(DEVICE)


def fused_and_sequence(batch: base.Batch, step: Step, window: int, *, sinks=None, splits=None, tile=None):
    """(out, k_cache, v_cache) of the fused launch and of the two-kernel sequence, on the CPU."""
    results = []
    for fused in (True, False):
        (q, k, v, cos, sin), (k_cache, v_cache), geometry, slots = _on_device(step, batch)
        sinks_on = None if sinks is None else sinks.to(DEVICE)
        splits_on = None if splits is None else splits.to(DEVICE)
        if fused:
            out = triton_rotary_paged_attention(q, k, v, cos, sin, k_cache, v_cache, slots, *geometry, SCALE, window,
                                                sinks_on, splits_on, tile=tile)
        else:
            rotated = triton_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slots)
            if splits_on is None:
                out = decode.paged_attention_decode(rotated, k_cache, v_cache, *geometry, SCALE, window,
                                                    sinks=sinks_on, tile=tile)
            else:
                out = decode.paged_attention_decode_tuned(rotated, k_cache, v_cache, *geometry, SCALE, window,
                                                          splits_on, sinks=sinks_on, tile=tile)
        results.append(tuple(t.cpu() for t in (out, k_cache, v_cache)))
    return results


def reference(batch: base.Batch, step: Step, window: int, sinks=None):
    """The CPU op (the reference bodies) on the clean batch: (out, k_cache, v_cache)."""
    k_cache, v_cache, table = (t.clone() for t in batch.clean)
    out = OPS.rotary_paged_attention(step.q, step.k, step.v, step.cos, step.sin, k_cache, v_cache, step.slots, table,
                                     batch.query_start, batch.positions, SCALE, window, sinks, None)
    return out, k_cache, v_cache


def assert_same(fused, sequence) -> None:
    """Output, k plane, v plane of the fused launch against the two-kernel sequence: bit for bit under
    the interpreter; on CUDA within the GPU tests' tolerance of the dtype (the compiler may contract a
    float32 rotary's products into fused multiply-adds differently in the two kernels)."""
    for name, got, expected in zip(("output", "k plane", "v plane"), fused, sequence):
        tolerance = base.TOLERANCE[got.dtype] if base.ON_CUDA else dict(rtol=0, atol=0)
        torch.testing.assert_close(got, expected, equal_nan=True, **tolerance, msg=lambda text: f"{name}: {text}")


def assert_written(got: torch.Tensor, expected: torch.Tensor, slots: torch.Tensor) -> None:
    """The entries at `slots` of a kernel's plane against the CPU reference's: bit for bit under the
    interpreter, within tolerance on CUDA (as tests/abi/test_triton_fused.py compares rotated keys)."""
    got, expected = (t.view(-1, *t.shape[2:])[slots] for t in (got, expected))
    tolerance = base.TOLERANCE[got.dtype] if base.ON_CUDA else dict(rtol=0, atol=0)
    torch.testing.assert_close(got, expected, **tolerance)


TILES = {"n16": decode.DecodeTile(16, 4, 2, 16), "k2-p2": decode.DecodeTile(8, 4, 2, 16, prefetch=2, kv_heads=2),
         "wide-spec": decode.DecodeTile(8, 4, 2, 16, wide=True, speculate=True)}


@pytest.mark.parametrize("tile_id", sorted(TILES))
@pytest.mark.parametrize("split", [1, 3])
def test_fused_launch_matches_the_two_kernels(tile_id, split):
    shape = Shape(page_tokens=8, dtype=torch.bfloat16)
    batch = make_batch(40, [1] * 5, RAGGED, shape)
    step = make_step(41, batch, shape)
    splits = torch.tensor([split], dtype=torch.int32)
    fused, sequence = fused_and_sequence(batch, step, 0, splits=splits, tile=TILES[tile_id])
    assert_same(fused, sequence)
    out, k_cache, v_cache = reference(batch, step, 0)
    torch.testing.assert_close(fused[0], out, **base.TOLERANCE[torch.bfloat16])
    for got, expected in ((fused[1], k_cache), (fused[2], v_cache)):  # this step's entries: the reference's
        assert_written(got, expected, step.slots)


def test_multi_token_row_padding_with_a_slot_and_sinks():
    """T <= R with a row of 3 tokens (each reads the others' new keys), an inactive row, and a padding
    token whose non-negative slot is written as helios::cache_write writes it."""
    shape = Shape(page_tokens=4, group=3)
    batch = make_batch(42, [3, 0, 1, 1, 0, 0], [5, 3, 12, 30, 1, 2], shape, padding=1)
    assert batch.q.shape[0] <= batch.query_start.shape[0] - 1
    step = make_step(43, batch, shape, padding_slot=spare_page(batch, [8, 3, 13, 31, 1, 2], 4) * 4 + 1)
    sinks = torch.randn(batch.q.shape[1], generator=torch.Generator().manual_seed(44))
    fused, sequence = fused_and_sequence(batch, step, 0, sinks=sinks, tile=decode.DecodeTile(8, 4, 2, 8))
    assert_same(fused, sequence)
    out, k_cache, _ = reference(batch, step, 0, sinks)
    torch.testing.assert_close(fused[0], out, **base.TOLERANCE[torch.float32])
    assert torch.all(fused[0][batch.num_real_tokens:] == 0)
    assert_written(fused[1], k_cache, step.slots[-1:])


def test_window_and_untuned_splits():
    shape = Shape(page_tokens=4)
    batch = make_batch(45, [1] * 5, RAGGED, shape)
    step = make_step(46, batch, shape)
    fused, sequence = fused_and_sequence(batch, step, 6, tile=decode.DecodeTile(16, 4, 2, 16))
    assert_same(fused, sequence)
    torch.testing.assert_close(fused[0], reference(batch, step, 6)[0], **base.TOLERANCE[torch.float32])


def test_prefill_shaped_steps_run_the_two_kernels():
    """T > R: the rotary kernel, then the prefill attention path; the reference's result."""
    shape = Shape(page_tokens=8)
    batch = make_batch(47, [5, 3], [4, 9], shape)
    step = make_step(48, batch, shape)
    (q, k, v, cos, sin), (k_cache, v_cache), geometry, slots = _on_device(step, batch)
    out = triton_rotary_paged_attention(q, k, v, cos, sin, k_cache, v_cache, slots, *geometry, SCALE, 0)
    torch.testing.assert_close(out.cpu(), reference(batch, step, 0)[0], **base.TOLERANCE[torch.float32])


def test_cpu_op_is_the_two_ops_in_order():
    shape = Shape(page_tokens=8)
    batch = make_batch(49, [1, 2, 1], [3, 7, 20], shape)
    step = make_step(50, batch, shape)
    out, k_cache, v_cache = reference(batch, step, 0)
    k_two, v_two, table = (t.clone() for t in batch.clean)
    rotated = OPS.rotary_cache_write(step.q, step.k, step.v, step.cos, step.sin, k_two, v_two, step.slots)
    expected = OPS.paged_attention(rotated, k_two, v_two, table, batch.query_start, batch.positions, SCALE, 0)
    assert torch.equal(out, expected) and torch.equal(k_cache, k_two) and torch.equal(v_cache, v_two)


def test_bad_arguments_raise_typed_errors():
    shape = Shape(page_tokens=8)
    batch = make_batch(51, [1, 1], [3, 7], shape)
    step = make_step(52, batch, shape)
    k_cache, v_cache, table = (t.clone() for t in batch.clean)
    args = (step.q, step.k, step.v, step.cos, step.sin, k_cache, v_cache, step.slots, table, batch.query_start,
            batch.positions, SCALE, 0)
    with pytest.raises(AbiArgumentError, match="sinks"):
        OPS.rotary_paged_attention(*args, torch.zeros(3), None)
    with pytest.raises(AbiArgumentError, match="splits"):
        OPS.rotary_paged_attention(*args, None, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(AbiArgumentError, match="cos"):
        OPS.rotary_paged_attention(*args[:3], step.cos[:, 0], *args[4:], None, None)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 64, 256])
def test_llama_8b_shapes_in_a_cuda_graph_match_the_two_kernels(rows):
    """8B shapes (32 query heads, 8 key/value heads, head_dim 128, bf16, pages of 16), the served tile
    table and tuned split counts, replayed from a CUDA graph: outputs and planes match those of the
    two-kernel sequence replayed from its own graph (`assert_same`), for contexts from 1 to 1,500
    positions; with the L2 prefetch of a 4096 x 4096 weight (extra programs that only prefetch). The
    written entries match the CPU op's and the output the CPU attention over them."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    shape = Shape(num_kv_heads=8, group=4, head_dim=128, page_tokens=16, dtype=torch.bfloat16)
    cached = [(97 * row) % (1500 if rows <= 64 else 300) for row in range(rows)]
    batch = make_batch(60 + rows, [1] * rows, cached, shape)
    step = make_step(61, batch, shape)
    splits = torch.ones(1, dtype=torch.int32, device="cuda")
    weight = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda")  # the prefetch hint (never read for results)
    results = {}
    for fused in ("prefetch", True, False):
        (q, k, v, cos, sin), (k_cache, v_cache), geometry, slots = _on_device(step, batch)
        clean_k, clean_v = k_cache.clone(), v_cache.clone()

        def layer():
            if fused:
                return triton_rotary_paged_attention(q, k, v, cos, sin, k_cache, v_cache, slots, *geometry, SCALE, 0,
                                                     None, splits, prefetch=weight if fused == "prefetch" else None)
            rotated = triton_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slots)
            return decode.paged_attention_decode_tuned(rotated, k_cache, v_cache, *geometry, SCALE, 0, splits)

        layer()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer()
        for count in (1, 3, 16):
            k_cache.copy_(clean_k)
            v_cache.copy_(clean_v)
            splits.fill_(count)
            graph.replay()
            results[fused, count] = tuple(t.cpu() for t in (out, k_cache, v_cache))
    for count in (1, 3, 16):
        assert_same(results[True, count], results[False, count])
        assert_same(results["prefetch", count], results[True, count])
    out, k_plane, v_plane = results[True, 1]
    _, ref_k, ref_v = reference(batch, step, 0)
    assert_written(k_plane, ref_k, step.slots)  # the rotated keys and the values, against the CPU op's
    assert_written(v_plane, ref_v, step.slots)
    torch.testing.assert_close(out, attention_of_written(batch, step, (k_plane, v_plane)), **base.TOLERANCE[torch.bfloat16])


def attention_of_written(batch: base.Batch, step: Step, planes) -> torch.Tensor:
    """The CPU attention op over what the device rotated and wrote: q rotated by the device's rotary
    kernel and the clean planes with the device's new entries at the step's slots. (The CPU op's own
    bfloat16 rotation rounds its products differently, a unit in the last place of some rotated q
    entries, which the 8B test's scale turns into differences beyond the bfloat16 tolerance in a few
    outputs: the rotation is compared entry by entry by `assert_written` and tests/abi/test_triton_fused.)"""
    (q, k, v, cos, sin), (k_cache, v_cache), _, slots = _on_device(step, batch)
    rotated = triton_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slots).cpu()
    clean_k, clean_v, table = (t.clone() for t in batch.clean)
    for clean, written in zip((clean_k, clean_v), planes):
        clean.view(-1, *clean.shape[2:])[step.slots] = written.view(-1, *written.shape[2:])[step.slots]
    return OPS.paged_attention(rotated, clean_k, clean_v, table, batch.query_start, batch.positions, SCALE, 0)
