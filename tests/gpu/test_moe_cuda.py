"""helios::moe_route and helios::moe_experts on CUDA: the CPU reference's results, no synchronisation,
and a captured CUDA graph replayed with new tokens, routes and weights gives the reference again."""

from __future__ import annotations

import pytest
import torch

from support.cuda_calls import capture, to_cuda, without_sync
from support.moe_inputs import expert_inputs, route_logits

pytestmark = pytest.mark.gpu
OPS = torch.ops.helios


def check(op: str, make, compare) -> None:
    """CUDA equals CPU; a synchronisation-free second call; graph replays on new static inputs."""
    function = getattr(OPS, op)
    compare(function(**to_cuda(make(0))), function(**make(0)))
    static = to_cuda(make(1))
    compare(without_sync(lambda: function(**static)), function(**make(1)))
    graph, outputs = capture(lambda: function(**static))
    for seed in (2, 3):
        fresh = make(seed)
        for name, value in fresh.items():
            if isinstance(value, torch.Tensor):
                static[name].copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        compare(outputs, function(**fresh))


ROUTES = [("softmax", 1, 1, True, 1.0, False), ("sigmoid", 8, 4, True, 2.5, True), ("sigmoid", 1, 1, False, 1.0, True),
          ("topk_softmax", 1, 1, False, 1.0, False), ("softmax", 8, 3, False, 16.0, False)]  # the last: DeepSeek-V2


@pytest.mark.parametrize("tokens", [1, 64, 300])
@pytest.mark.parametrize("scoring,groups,kept,normalize,scale,bias", ROUTES)
def test_routing(tokens, scoring, groups, kept, normalize, scale, bias):
    def make(seed):
        return dict(logits=route_logits(tokens, 128, seed), scoring=scoring, top_k=8, num_groups=groups,
                    topk_groups=kept, normalize=normalize, scale=scale,
                    correction_bias=route_logits(1, 128, seed + 100)[0] * 0.1 if bias else None)

    def compare(actual, expected):
        assert torch.equal(actual[1].cpu(), expected[1])
        torch.testing.assert_close(actual[0].cpu(), expected[0], rtol=1e-5, atol=1e-6)

    check("moe_route", make, compare)


EXPERT_CASES = [
    dict(tokens=1, hidden=2048, ffn=768, experts=128, top_k=8, dtype=torch.bfloat16),  # Qwen3-30B-A3B decode
    dict(tokens=4, hidden=2048, ffn=768, experts=128, top_k=8, dtype=torch.bfloat16),  # the largest matrix-vector
    dict(tokens=5, hidden=256, ffn=96, experts=8, top_k=8, dtype=torch.float32),  # the smallest grouped
    dict(tokens=64, hidden=2048, ffn=768, experts=128, top_k=8, dtype=torch.bfloat16),
    dict(tokens=300, hidden=512, ffn=256, experts=16, top_k=4, dtype=torch.bfloat16),  # prefill blocks
    dict(tokens=33, hidden=256, ffn=96, experts=8, top_k=2, dtype=torch.float32),
    dict(tokens=3, hidden=512, ffn=256, experts=32, top_k=4, dtype=torch.bfloat16, bias=True,
         activation="swiglu_clamped"),
    dict(tokens=17, hidden=512, ffn=256, experts=32, top_k=4, dtype=torch.bfloat16, bias=True,
         activation="swiglu_clamped"),  # gpt-oss
]


@pytest.mark.parametrize("case", EXPERT_CASES, ids=lambda c: f"{c['tokens']}x{c['experts']}-{c['dtype']}")
def test_experts(case):
    tolerance = dict(rtol=1e-4, atol=1e-4) if case["dtype"] == torch.float32 else dict(rtol=3e-2, atol=3e-2)

    def make(seed):
        return expert_inputs(**case, seed=seed)

    def compare(actual, expected):
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual.cpu().float(), expected.float(), **tolerance)

    check("moe_experts", make, compare)
