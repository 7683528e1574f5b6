"""helios::gated_delta_rule on CUDA (the torch body, no kernel of its own): the CPU reference's results,
also when captured in a CUDA graph and replayed (the op reads nothing on the host)."""

from __future__ import annotations

import pytest
import torch

import helios.abi.delta_rule  # noqa: F401

pytestmark = pytest.mark.gpu
HK, HV, DK, DV, T = 2, 4, 32, 16, 12


def _args(device):
    g = torch.Generator().manual_seed(5)
    tensors = dict(
        state=torch.randn(5, HV, DK, DV, generator=g), q=torch.randn(T, HK, DK, generator=g),
        k=torch.randn(T, HK, DK, generator=g), v=torch.randn(T, HV, DV, generator=g),
        g=-torch.rand(T, HV, generator=g) * 3, beta=torch.rand(T, HV, generator=g),
        qs=torch.tensor([0, 5, 5, 11], dtype=torch.int32), rows=torch.tensor([3, -1, 0]),
        fresh=torch.tensor([True, False, False]),
    )
    return {k: v.to(device) for k, v in tensors.items()}


def _run(a):
    return torch.ops.helios.gated_delta_rule(a["state"], a["q"], a["k"], a["v"], a["g"], a["beta"], a["qs"],
                                             a["rows"], a["fresh"], T)


def test_cuda_equals_cpu_and_replays_in_a_cuda_graph():
    cpu = _args("cpu")
    o_cpu = _run(cpu)
    eager = _args("cuda")
    torch.testing.assert_close(_run(eager).cpu(), o_cpu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(eager["state"].cpu(), cpu["state"], rtol=1e-5, atol=1e-5)
    captured = _args("cuda")
    start = captured["state"].clone()
    _run(captured)  # warm up on a side stream's allocations
    captured["state"].copy_(start)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _run(captured)
    captured["state"].copy_(start)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu(), o_cpu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(captured["state"].cpu(), cpu["state"], rtol=1e-5, atol=1e-5)
