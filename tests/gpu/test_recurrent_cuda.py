"""helios::causal_conv_update and helios::ssm_scan on CUDA: the CPU reference's results, also when
captured in a CUDA graph and replayed (the ops read nothing on the host)."""

from __future__ import annotations

import pytest
import torch

import helios.abi.recurrent  # noqa: F401

pytestmark = pytest.mark.gpu
H, P, N, G, CH, K, T = 4, 8, 16, 2, 24, 4, 12


def _args(device):
    g = torch.Generator().manual_seed(3)
    tensors = dict(
        ssm=torch.randn(5, H, P, N, generator=g), conv=torch.randn(5, CH, K - 1, generator=g),
        x=torch.randn(T, H, P, generator=g), dt=torch.rand(T, H, generator=g) + 0.05,
        A=-torch.rand(H, generator=g) - 0.1, B=torch.randn(T, G, N, generator=g), C=torch.randn(T, G, N, generator=g),
        u=torch.randn(T, CH, generator=g), w=torch.randn(CH, K, generator=g), b=torch.randn(CH, generator=g),
        qs=torch.tensor([0, 5, 5, 11], dtype=torch.int32), rows=torch.tensor([3, -1, 0]),
        fresh=torch.tensor([True, False, False]),
    )
    return {k: v.to(device) for k, v in tensors.items()}


def _run(a):
    y = torch.ops.helios.ssm_scan(a["ssm"], a["x"], a["dt"], a["A"], a["B"], a["C"], a["qs"], a["rows"], a["fresh"], T)
    c = torch.ops.helios.causal_conv_update(a["conv"], a["u"], a["w"], a["b"], a["qs"], a["rows"], a["fresh"], T)
    return y, c


def test_cuda_equals_cpu_and_replays_in_a_cuda_graph():
    cpu = _args("cpu")
    y_cpu, c_cpu = _run(cpu)
    eager = _args("cuda")
    y, c = _run(eager)
    torch.testing.assert_close(y.cpu(), y_cpu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c.cpu(), c_cpu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(eager["ssm"].cpu(), cpu["ssm"], rtol=1e-5, atol=1e-5)
    captured = _args("cuda")
    start_ssm, start_conv = captured["ssm"].clone(), captured["conv"].clone()
    _run(captured)  # warm up on a side stream's allocations
    captured["ssm"].copy_(start_ssm)
    captured["conv"].copy_(start_conv)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _run(captured)
    captured["ssm"].copy_(start_ssm)
    captured["conv"].copy_(start_conv)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out[0].cpu(), y_cpu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(captured["conv"].cpu(), cpu["conv"], rtol=1e-5, atol=1e-5)
