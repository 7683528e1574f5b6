"""Execution ABI: mixture-of-experts routing and expert computation (namespace ``helios``).

Importing this module registers two custom ops with ``torch.library``. The bodies here are the CPU
references (the expert op reads which experts are active on the host and loops over them; routing
is device tensor ops only). On CUDA routing runs as one Triton kernel per call
(`helios.abi.triton_route`) and the expert op as the Triton kernels of `helios.abi.triton_moe`
(both imported on first use); neither ever synchronises, every shape is static, so both can be
captured in a CUDA graph.

``helios::moe_route(Tensor logits, Tensor? correction_bias, str scoring, int top_k, int num_groups,
int topk_groups, bool normalize, float scale) -> (Tensor, Tensor)``
    logits: [T, E] router logits (any float dtype; scored in float32). Returns ``(weights, ids)``:
    weights float32 [T, top_k], ids int64 [T, top_k] (the chosen experts, best first).
    scoring:
      - ``"softmax"`` (Qwen3-MoE, Mixtral, DeepSeek-V2, Ernie 4.5 MoE): p = softmax(logits); the top_k
        largest p (with a correction_bias, Ernie's, one group only: the top_k largest p + correction_bias,
        weighted by p); with ``normalize`` the weights are divided by their sum. With
        num_groups > 1 (DeepSeek-V2's "group_limited_greedy") the E experts form num_groups equal
        groups, a group scores its best p, and only the topk_groups best groups stay eligible; the
        weights stay the p of the softmax over all E experts.
      - ``"topk_softmax"`` (gpt-oss): the top_k largest logits; weights = softmax over those k
        (normalize is ignored: they already sum to 1). correction_bias None, num_groups 1.
      - ``"sigmoid"`` (DeepSeek-V3, GLM-4.5): s = sigmoid(logits); choice = s + correction_bias
        (float32 [E], when given). With num_groups > 1 the E experts form num_groups equal groups,
        a group scores the sum of its two best choices, only the topk_groups best groups stay
        eligible; the top_k best eligible choices are picked and weighted by s (not by the bias).
        With ``normalize`` weights are divided by (their sum + 1e-20).
    Every scoring finally multiplies the weights by ``scale`` (routed_scaling_factor; 1.0 for none).
    Ties between equal scores are broken as ``torch.topk`` breaks them.

``helios::moe_experts(Tensor hidden, Tensor weights, Tensor ids, Tensor gate_up, Tensor? gate_up_bias,
Tensor down, Tensor? down_bias, str activation, float alpha, float limit) -> Tensor``
    hidden: [T, H]; weights float32 [T, K]; ids int64 [T, K]; gate_up [E, 2F, H] (``nn.Linear``
    layout [out, in]: rows 0..F-1 the gate, rows F..2F-1 the up projection, NOT interleaved);
    gate_up_bias [E, 2F] or None; down [E, H, F]; down_bias [E, H] or None; all weights in hidden's
    dtype. For each token t:
        out[t] = sum_k weights[t, k] * (down[e] @ act(gate_up[e] @ hidden[t] + b1[e]) + b2[e]),  e = ids[t, k]
    where ids outside [0, E) contribute nothing (so a caller holding a slice of the experts passes
    ``ids - first_local_expert``: expert parallelism). activation:
      - ``"silu"``: act(g, u) = silu(g) * u (alpha and limit are ignored);
      - ``"swiglu_clamped"`` (gpt-oss): g = min(g, limit), u = clamp(u, -limit, limit),
        act = (u + 1) * g * sigmoid(alpha * g);
      - ``"relu2"`` (Nemotron-H), a non-gated expert: gate_up holds only the F up rows per expert
        ([E, F, H], gate_up_bias [E, F]) and act(u) = relu(u)^2.
    Products accumulate in float32; the activation and the weighted sum over k run in float32;
    returns [T, H] in hidden's dtype. The CUDA kernel reads only the weights of the experts that
    some token selected.
"""

from __future__ import annotations

import torch

from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor

__all__ = [
    "ACTIVATIONS", "MOE_EXPERTS_SCHEMA", "MOE_ROUTE_SCHEMA", "NON_GATED", "SCORINGS", "expert_width", "moe_experts",
    "moe_route",
    "reference_experts", "reference_route",
]

MOE_ROUTE_SCHEMA = (
    "(Tensor logits, Tensor? correction_bias, str scoring, int top_k, int num_groups, int topk_groups, "
    "bool normalize, float scale) -> (Tensor, Tensor)"
)
MOE_EXPERTS_SCHEMA = (
    "(Tensor hidden, Tensor weights, Tensor ids, Tensor gate_up, Tensor? gate_up_bias, Tensor down, "
    "Tensor? down_bias, str activation, float alpha, float limit) -> Tensor"
)
SCORINGS = ("softmax", "topk_softmax", "sigmoid")
ACTIVATIONS = ("silu", "swiglu_clamped", "relu2")
NON_GATED = ("relu2",)  # experts whose gate_up holds only the up rows
_ROUTE, _EXPERTS = "helios::moe_route", "helios::moe_experts"
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def check_route_args(logits, correction_bias, scoring: str, top_k: int, num_groups: int, topk_groups: int) -> None:
    """Metadata-only validation of ``helios::moe_route`` (safe on fake tensors)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype not in _FLOATS:
        raise AbiArgumentError(f"{_ROUTE}: logits must be a float tensor [T, E]")
    num_experts = logits.shape[1]
    if scoring not in SCORINGS:
        raise AbiArgumentError(f"{_ROUTE}: scoring {scoring!r} is not one of {SCORINGS}")
    if not 1 <= top_k <= num_experts:
        raise AbiArgumentError(f"{_ROUTE}: top_k {top_k} is not in [1, {num_experts}]")
    if num_groups < 1 or num_experts % num_groups or not 1 <= topk_groups <= num_groups:
        raise AbiArgumentError(
            f"{_ROUTE}: {num_groups} groups / {topk_groups} kept do not fit {num_experts} experts")
    if scoring == "topk_softmax" and correction_bias is not None:
        raise AbiArgumentError(f"{_ROUTE}: {scoring} scoring takes no correction bias")
    if scoring == "softmax" and correction_bias is not None and num_groups != 1:
        raise AbiArgumentError(f"{_ROUTE}: softmax scoring takes a correction bias with one group only")
    if scoring == "topk_softmax" and num_groups != 1:
        raise AbiArgumentError(f"{_ROUTE}: {scoring} scoring takes one group")
    if scoring == "sigmoid" and num_groups > 1 and num_experts // num_groups < 2:
        raise AbiArgumentError(f"{_ROUTE}: a group needs at least two experts (it scores its best two)")
    if num_groups > 1 and top_k > topk_groups * (num_experts // num_groups):
        raise AbiArgumentError(f"{_ROUTE}: top_k {top_k} exceeds the experts of {topk_groups} groups")
    if correction_bias is not None:
        check_tensor(_ROUTE, "correction_bias", correction_bias, torch.float32, (num_experts,))
        check_same_device(_ROUTE, dict(logits=logits, correction_bias=correction_bias))


def reference_route(logits, correction_bias, scoring: str, top_k: int, num_groups: int, topk_groups: int,
                    normalize: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing arithmetic (device tensor ops only: no host reads, static shapes)."""
    logits = logits.float()
    if scoring == "topk_softmax":
        values, ids = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(values, dim=-1) * scale, ids
    if scoring == "softmax":
        scores = torch.softmax(logits, dim=-1)
        choice = scores if correction_bias is None else scores + correction_bias
        if num_groups > 1:  # a group scores its best expert
            choice = _best_groups(scores, scores.view(scores.shape[0], num_groups, -1).amax(dim=-1), num_groups,
                                  topk_groups)
        ids = torch.topk(choice, top_k, dim=-1)[1]
        weights = scores.gather(1, ids)
        if normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * scale, ids
    scores = torch.sigmoid(logits)
    choice = scores if correction_bias is None else scores + correction_bias
    if num_groups > 1:
        grouped = choice.view(choice.shape[0], num_groups, -1)
        choice = _best_groups(choice, grouped.topk(2, dim=-1)[0].sum(dim=-1), num_groups, topk_groups)
    ids = torch.topk(choice, top_k, dim=-1)[1]
    weights = scores.gather(1, ids)
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scale, ids


def _best_groups(choice, group_scores, num_groups: int, topk_groups: int) -> torch.Tensor:
    """`choice` [T, E] with the experts outside the `topk_groups` best-scoring of `num_groups` groups at -inf."""
    grouped = choice.view(choice.shape[0], num_groups, -1)
    kept = torch.topk(group_scores, topk_groups, dim=-1)[1]
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
    return grouped.masked_fill(~group_mask[:, :, None], float("-inf")).view_as(choice)


@abi_op(_ROUTE, mutates_args=(), schema=MOE_ROUTE_SCHEMA)
def moe_route(logits, correction_bias, scoring, top_k, num_groups, topk_groups, normalize, scale):
    check_route_args(logits, correction_bias, scoring, top_k, num_groups, topk_groups)
    return reference_route(logits, correction_bias, scoring, top_k, num_groups, topk_groups, normalize, scale)


@moe_route.register_kernel("cuda")
def _moe_route_cuda(logits, correction_bias, scoring, top_k, num_groups, topk_groups, normalize, scale):
    check_route_args(logits, correction_bias, scoring, top_k, num_groups, topk_groups)
    from helios.abi.triton_route import triton_moe_route

    return triton_moe_route(logits, correction_bias, scoring, top_k, num_groups, topk_groups, normalize, scale)


@moe_route.register_fake
def _moe_route_fake(logits, correction_bias, scoring, top_k, num_groups, topk_groups, normalize, scale):
    check_route_args(logits, correction_bias, scoring, top_k, num_groups, topk_groups)
    rows = logits.shape[0]
    return (logits.new_empty((rows, top_k), dtype=torch.float32),
            logits.new_empty((rows, top_k), dtype=torch.int64))


def check_experts_args(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation: str) -> None:
    """Metadata-only validation of ``helios::moe_experts`` (safe on fake tensors)."""
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2 or hidden.dtype not in _FLOATS:
        raise AbiArgumentError(f"{_EXPERTS}: hidden must be a float tensor [T, H]")
    if activation not in ACTIVATIONS:
        raise AbiArgumentError(f"{_EXPERTS}: activation {activation!r} is not one of {ACTIVATIONS}")
    tokens, width = hidden.shape
    check_tensor(_EXPERTS, "weights", weights, torch.float32, (tokens, None))
    check_tensor(_EXPERTS, "ids", ids, torch.int64, tuple(weights.shape))
    check_tensor(_EXPERTS, "gate_up", gate_up, hidden.dtype, (None, None, width))
    experts, double = gate_up.shape[0], gate_up.shape[1]
    if double % 2 and activation not in NON_GATED:
        raise AbiArgumentError(f"{_EXPERTS}: gate_up has {double} rows per expert, not gate + up (even)")
    check_tensor(_EXPERTS, "down", down, hidden.dtype, (experts, width, expert_width(gate_up, activation)))
    tensors = dict(hidden=hidden, weights=weights, ids=ids, gate_up=gate_up, down=down)
    if gate_up_bias is not None:
        check_tensor(_EXPERTS, "gate_up_bias", gate_up_bias, hidden.dtype, (experts, double))
        tensors["gate_up_bias"] = gate_up_bias
    if down_bias is not None:
        check_tensor(_EXPERTS, "down_bias", down_bias, hidden.dtype, (experts, width))
        tensors["down_bias"] = down_bias
    check_same_device(_EXPERTS, tensors)


def expert_width(gate_up: torch.Tensor, activation: str) -> int:
    """F, an expert's intermediate width: gate_up's rows per expert, halved unless non-gated."""
    return gate_up.shape[1] if activation in NON_GATED else gate_up.shape[1] // 2


def activate(gate_up: torch.Tensor, activation: str, alpha: float, limit: float) -> torch.Tensor:
    """float32 activation of [N, 2F] gate/up pre-activations (gate columns first), or of [N, F] up
    pre-activations of a non-gated expert."""
    if activation == "relu2":
        return torch.square(torch.relu(gate_up.float()))
    gate, up = gate_up.float().chunk(2, dim=-1)
    if activation == "silu":
        return torch.nn.functional.silu(gate) * up
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def reference_experts(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation: str,
                      alpha: float, limit: float) -> torch.Tensor:
    """Loop over the active experts (reads the ids on the host)."""
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    num_experts = gate_up.shape[0]
    for expert in torch.unique(ids).tolist():
        if not 0 <= expert < num_experts:
            continue
        tokens, slots = torch.nonzero(ids == expert, as_tuple=True)
        bias = None if gate_up_bias is None else gate_up_bias[expert]
        inner = activate(torch.nn.functional.linear(hidden[tokens], gate_up[expert], bias), activation, alpha, limit)
        bias = None if down_bias is None else down_bias[expert]
        result = torch.nn.functional.linear(inner.to(hidden.dtype), down[expert], bias).float()
        out.index_add_(0, tokens, result * weights[tokens, slots, None])
    return out.to(hidden.dtype)


@abi_op(_EXPERTS, mutates_args=(), schema=MOE_EXPERTS_SCHEMA)
def moe_experts(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation, alpha, limit):
    check_experts_args(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation)
    return reference_experts(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation, alpha, limit)


@moe_experts.register_fake
def _moe_experts_fake(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation, alpha, limit):
    check_experts_args(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation)
    return torch.empty_like(hidden)


@moe_experts.register_kernel("cuda")
def _moe_experts_cuda(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation, alpha, limit):
    check_experts_args(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation)
    from helios.abi.triton_moe import triton_moe_experts

    return triton_moe_experts(hidden, weights, ids, gate_up, gate_up_bias, down, down_bias, activation, alpha, limit)
