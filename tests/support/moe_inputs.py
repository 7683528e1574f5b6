"""Random inputs for the mixture-of-experts ABI ops (shared by the CPU, Triton and CUDA tests)."""

from __future__ import annotations

import torch


def route_logits(tokens: int, experts: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, experts, generator=generator)


def expert_inputs(tokens: int = 7, hidden: int = 48, ffn: int = 40, experts: int = 6, top_k: int = 3,
                  bias: bool = False, activation: str = "silu", dtype=torch.float32, seed: int = 0) -> dict:
    """Keyword arguments of ``helios::moe_experts``; a few ids fall outside [0, E) (skipped). A
    non-gated activation (relu2) takes ffn up rows per expert, the others gate + up rows."""
    rows = ffn if activation == "relu2" else 2 * ffn
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(dtype)

    scores = torch.rand(tokens, experts, generator=generator)
    weights, ids = scores.topk(top_k, dim=-1)
    if tokens > 2 and top_k > 1:
        ids[0, 1] = -1
        ids[2, 0] = experts
    return dict(
        hidden=rand(tokens, hidden), weights=weights.float(), ids=ids,
        gate_up=rand(experts, rows, hidden, scale=hidden ** -0.5),  # unit-scale pre-activations at any width
        gate_up_bias=rand(experts, rows) if bias else None,
        down=rand(experts, hidden, ffn, scale=ffn ** -0.5), down_bias=rand(experts, hidden) if bias else None,
        activation=activation, alpha=1.702, limit=0.7,
    )


def dense_experts(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation, alpha, limit):
    """Every (token, slot) computed on its own in float64: the definition, not the reference's loop."""
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for token in range(hidden.shape[0]):
        for slot in range(ids.shape[1]):
            expert = int(ids[token, slot])
            if not 0 <= expert < gate_up.shape[0]:
                continue
            pre = gate_up[expert].double() @ hidden[token].double()
            if gate_up_bias is not None:
                pre = pre + gate_up_bias[expert].double()
            if activation == "relu2":  # non-gated: pre is the up projection
                inner = torch.relu(pre) ** 2
            elif activation == "silu":
                gate, up = pre.chunk(2)
                inner = torch.nn.functional.silu(gate) * up
            else:
                gate, up = pre.chunk(2)
                gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
                inner = (up + 1) * gate * torch.sigmoid(alpha * gate)
            result = down[expert].double() @ inner
            if down_bias is not None:
                result = result + down_bias[expert].double()
            out[token] += float(weights[token, slot]) * result
    return out
