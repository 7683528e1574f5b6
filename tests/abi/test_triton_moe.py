"""The Triton kernels of helios::moe_experts against the CPU reference op.

Without CUDA the kernels run under Triton's interpreter on CPU tensors (`enable_interpreter`, before
triton is first imported; see test_triton_attention.py); with CUDA they run compiled.
"""

from __future__ import annotations

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

from helios.abi import moe  # noqa: E402,F401  (registers the reference ops)
from helios.abi import triton_moe as kernels  # noqa: E402
from helios.abi.moe_tiles import KernelTiles, LaunchTiles, default_tiles  # noqa: E402
from support.moe_inputs import expert_inputs, route_logits  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def run_kernel(inputs: dict) -> torch.Tensor:
    on_device = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return kernels.triton_moe_experts(**on_device).cpu()


@pytest.mark.parametrize("tokens", [9, 40], ids=["matrix-vector", "grouped"])
@pytest.mark.parametrize("activation", moe.ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_equals_reference(tokens, activation, bias):
    assert (tokens * 2 <= kernels.GEMV_ASSIGNMENTS) == (tokens == 9)
    inputs = expert_inputs(tokens=tokens, hidden=40, ffn=24, experts=5, top_k=2, bias=bias, activation=activation)
    torch.testing.assert_close(run_kernel(inputs), torch.ops.helios.moe_experts(**inputs), **TOLERANCE[torch.float32])


def test_many_tokens_per_expert_span_several_blocks_and_ragged_tiles():
    """More than BLOCK_M rows for some experts (one expert gets most), widths not multiples of the tiles."""
    inputs = expert_inputs(tokens=40, hidden=70, ffn=36, experts=4, top_k=2, seed=3)
    inputs["ids"][:30, 0] = 1
    inputs["ids"][:30, 1] = torch.where(inputs["ids"][:30, 1] == 1, 2, inputs["ids"][:30, 1])
    torch.testing.assert_close(run_kernel(inputs), torch.ops.helios.moe_experts(**inputs), **TOLERANCE[torch.float32])


def test_large_batches_use_the_prefill_block_size():
    inputs = expert_inputs(tokens=260, hidden=32, ffn=16, experts=8, top_k=2, seed=5)
    assert default_tiles("grouped", 260 * 2, 8).gate_up.block_m == 64
    assert default_tiles("grouped", 64 * 8, 128).gate_up.block_m == 16
    torch.testing.assert_close(run_kernel(inputs), torch.ops.helios.moe_experts(**inputs), **TOLERANCE[torch.float32])


TUNED = [("gemv", 9, LaunchTiles(KernelTiles(1, 16, 32, 2, 1), KernelTiles(1, 64, 16, 8, 3))),
         ("grouped", 40, LaunchTiles(KernelTiles(32, 16, 32, 8, 3), KernelTiles(32, 128, 16, 2, 1)))]


@pytest.mark.parametrize("path,tokens,tiles", TUNED, ids=[t[0] for t in TUNED])
def test_other_tiles_give_the_reference(path, tokens, tiles):
    """The tiles a tuned table may choose (what the tuning script sweeps) keep the results."""
    inputs = expert_inputs(tokens=tokens, hidden=40, ffn=24, experts=5, top_k=2, bias=True, seed=2)
    on_device = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    out = kernels.triton_moe_experts(**on_device, tiles=tiles).cpu()
    torch.testing.assert_close(out, torch.ops.helios.moe_experts(**inputs), **TOLERANCE[torch.float32])


@pytest.mark.parametrize("tokens", [6, 20], ids=["matrix-vector", "grouped"])
def test_bfloat16(tokens):
    inputs = expert_inputs(tokens=tokens, hidden=64, ffn=32, experts=4, top_k=2, dtype=torch.bfloat16, bias=True,
                           activation="swiglu_clamped")
    out = run_kernel(inputs)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), torch.ops.helios.moe_experts(**inputs).float(), **TOLERANCE[torch.bfloat16])


def test_block_schedule_covers_each_expert_run_once():
    ids = torch.tensor([[3, 0], [3, 1], [3, 9], [-1, 3], [0, 3]])
    order, block_expert, start, end = kernels.block_schedule(ids, num_experts=4, rows_per_block=2)
    assert block_expert.shape[0] == min(10, 5 + 4)  # a static bound: depends on shapes only
    flat = ids.reshape(-1)
    covered = []
    for expert, lo, hi in zip(block_expert.tolist(), start.tolist(), end.tolist()):
        if expert < 0:
            continue
        rows = list(range(lo, min(lo + 2, hi)))
        assert all(int(flat[order[r]]) == expert for r in rows)
        covered += [int(order[r]) for r in rows]
    assert sorted(covered) == [i for i, e in enumerate(flat.tolist()) if 0 <= e < 4]


@pytest.mark.parametrize("tokens,experts,top_k,rows", [(5, 4, 2, 2), (40, 6, 3, 16), (64, 128, 8, 16), (300, 8, 2, 64)])
def test_device_schedule_equals_the_torch_schedule(tokens, experts, top_k, rows):
    ids = torch.rand(tokens, experts, generator=torch.Generator().manual_seed(tokens)).topk(top_k, dim=-1)[1]
    ids[0, 0], ids[-1, -1] = -1, experts  # skipped assignments
    expected = kernels.block_schedule(ids, experts, rows)
    order, block_expert, start, end = (t.cpu() for t in kernels.device_block_schedule(ids.to(DEVICE), experts, rows))
    assert torch.equal(order, expected[0]) and torch.equal(block_expert, expected[1])
    live = block_expert >= 0
    assert torch.equal(start[live], expected[2][live]) and torch.equal(end[live], expected[3][live])


# The compiler, stricter than the interpreter, accepts every kernel (PTX and ptxas, sm_90):
# test_kernels_compile_for_hopper (compile_moe_kernels.py).


def test_expert_op_has_a_cuda_kernel_registered():
    assert torch._C._dispatch_has_kernel_for_dispatch_key("helios::moe_experts", "CUDA")


ROUTES = [("softmax", 1, 1, True, 1.0, False), ("softmax", 1, 1, False, 1.0, False),
          ("topk_softmax", 1, 1, False, 1.0, False), ("sigmoid", 4, 2, True, 2.5, True),
          ("sigmoid", 1, 1, False, 1.0, True), ("sigmoid", 3, 2, True, 1.0, False),
          ("softmax", 4, 2, False, 16.0, False), ("softmax", 3, 1, True, 1.0, False),  # DeepSeek-V2's groups
          ("softmax", 1, 1, True, 1.0, True)]  # Ernie 4.5 MoE's choice bias


@pytest.mark.parametrize("scoring,groups,kept,normalize,scale,bias", ROUTES)
def test_routing_kernel_equals_reference(scoring, groups, kept, normalize, scale, bias):
    """12 and 24 experts: not powers of two, so padded group and member lanes are exercised."""
    from helios.abi.triton_route import triton_moe_route

    for tokens, experts, top_k in ((5, 12, 3), (3, 24, 5)):
        logits = route_logits(tokens, experts, seed=experts)
        correction = route_logits(1, experts, seed=7)[0] * 0.1 if bias else None
        args = (correction, scoring, top_k, groups, kept, normalize, scale)
        expected = torch.ops.helios.moe_route(logits, *args)
        on_device = (correction.to(DEVICE) if bias else None, *args[1:])
        weights, ids = triton_moe_route(logits.to(DEVICE), *on_device)
        assert torch.equal(ids.cpu(), expected[1])
        torch.testing.assert_close(weights.cpu(), expected[0], rtol=1e-6, atol=1e-7)


def test_routing_op_has_a_cuda_kernel_registered():
    assert torch._C._dispatch_has_kernel_for_dispatch_key("helios::moe_route", "CUDA")
