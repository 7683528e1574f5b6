"""Triton kernel of ``helios::moe_route`` (CUDA; CPU under TRITON_INTERPRET=1).

The semantic contract is the docstring of `helios.abi.moe`. One program per token holds the token's
E scores as a [groups, experts per group] tile (top-k softmax scoring: one group), so a
whole routing decision (scores, group limit, top-k, normalisation, scale) is one launch instead of a
dozen small ops. Top-k is k rounds of "take the best remaining score"; equal scores pick the lower
expert id (the reference breaks ties as ``torch.topk`` does; distinct scores agree exactly).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["triton_moe_route"]

_SCORINGS = {"softmax": 0, "topk_softmax": 1, "sigmoid": 2}
_NO_INDEX = tl.constexpr(1 << 30)


@triton.jit
def _best(values, index):
    """The best value of a 2-D tile and its lowest flat index."""
    best = tl.max(tl.max(values, axis=1), axis=0)
    at = tl.min(tl.min(tl.where(values == best, index, _NO_INDEX), axis=1), axis=0)
    return best, at


@triton.jit
def _keep_best_groups(choice, member, NUM_GROUPS: tl.constexpr, TOPK_GROUPS: tl.constexpr,
                      BLOCK_G: tl.constexpr, BEST_ONLY: tl.constexpr):
    """choice with every expert outside the TOPK_GROUPS best groups at -inf: groups scored by their
    best two experts' sum, or (BEST_ONLY, softmax scoring) by their best expert."""
    first = tl.max(choice, axis=1)
    if BEST_ONLY:
        group_score = first
    else:
        first_at = tl.min(tl.where(choice == first[:, None], member, _NO_INDEX), axis=1)
        group_score = first + tl.max(tl.where(member == first_at[:, None], float("-inf"), choice), axis=1)
    groups = tl.arange(0, BLOCK_G)
    group_scores = tl.where(groups < NUM_GROUPS, group_score, float("-inf"))
    kept = groups < 0
    for _ in tl.static_range(TOPK_GROUPS):
        best = tl.max(group_scores, axis=0)
        at = tl.min(tl.where(group_scores == best, groups, _NO_INDEX), axis=0)
        kept = kept | (groups == at)
        group_scores = tl.where(groups == at, float("-inf"), group_scores)
    return tl.where(kept[:, None], choice, float("-inf"))


@triton.jit
def _route_kernel(logits, bias, weights_out, ids_out, stride_l, scale, SCORING: tl.constexpr,
                  HAS_BIAS: tl.constexpr, NORMALIZE: tl.constexpr, TOP_K: tl.constexpr, NUM_GROUPS: tl.constexpr,
                  GROUP_SIZE: tl.constexpr, TOPK_GROUPS: tl.constexpr, BLOCK_G: tl.constexpr,
                  BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    token = tl.program_id(0)
    groups, members = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_S)
    valid = (groups[:, None] < NUM_GROUPS) & (members[None, :] < GROUP_SIZE)
    expert = groups[:, None] * GROUP_SIZE + members[None, :]
    member = members[None, :] + groups[:, None] * 0
    x = tl.load(logits + token.to(tl.int64) * stride_l + expert, mask=valid, other=float("-inf")).to(tl.float32)
    if SCORING == 0:
        exp = tl.exp(x - tl.max(tl.max(x, axis=1), axis=0))
        scores = exp / tl.sum(tl.sum(exp, axis=1), axis=0)
        choice = scores
        if HAS_BIAS:  # Ernie 4.5 MoE's choice bias (one group)
            choice = choice + tl.load(bias + expert, mask=valid, other=0.0)
        choice = tl.where(valid, choice, float("-inf"))
        if NUM_GROUPS > 1:
            choice = _keep_best_groups(choice, member, NUM_GROUPS, TOPK_GROUPS, BLOCK_G, True)
    elif SCORING == 1:
        scores = x
        choice = x
    else:
        scores = tl.sigmoid(x)
        choice = scores
        if HAS_BIAS:
            choice = choice + tl.load(bias + expert, mask=valid, other=0.0)
        choice = tl.where(valid, choice, float("-inf"))
        if NUM_GROUPS > 1:
            choice = _keep_best_groups(choice, member, NUM_GROUPS, TOPK_GROUPS, BLOCK_G, False)
    slots = tl.arange(0, BLOCK_K)
    picked_ids = tl.zeros((BLOCK_K,), dtype=tl.int64)
    picked = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        _, at = _best(choice, expert)
        value = tl.sum(tl.sum(tl.where(expert == at, scores, 0.0), axis=1), axis=0)
        picked_ids = tl.where(slots == slot, at.to(tl.int64), picked_ids)
        picked = tl.where(slots == slot, value, picked)
        choice = tl.where(expert == at, float("-inf"), choice)
    live = slots < TOP_K
    if SCORING == 1:
        exp = tl.where(live, tl.exp(picked - tl.max(tl.where(live, picked, float("-inf")), axis=0)), 0.0)
        picked = exp / tl.sum(exp, axis=0)
    elif NORMALIZE:
        total = tl.sum(tl.where(live, picked, 0.0), axis=0)
        if SCORING == 2:
            total = total + 1e-20
        picked = picked / total
    out = token.to(tl.int64) * TOP_K + slots
    tl.store(weights_out + out, picked * scale, mask=live)
    tl.store(ids_out + out, picked_ids, mask=live)


def triton_moe_route(logits, correction_bias, scoring: str, top_k: int, num_groups: int, topk_groups: int,
                     normalize: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``helios::moe_route`` on validated inputs (see `helios.abi.moe`)."""
    tokens, experts = logits.shape
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int64, device=logits.device)
    if tokens == 0:
        return weights, ids
    logits = logits.contiguous()
    group_size = experts // num_groups
    _route_kernel[(tokens,)](
        logits, correction_bias if correction_bias is not None else logits, weights, ids, logits.stride(0),
        float(scale), SCORING=_SCORINGS[scoring], HAS_BIAS=correction_bias is not None, NORMALIZE=bool(normalize),
        TOP_K=top_k, NUM_GROUPS=num_groups, GROUP_SIZE=group_size, TOPK_GROUPS=topk_groups,
        BLOCK_G=triton.next_power_of_2(num_groups), BLOCK_S=triton.next_power_of_2(group_size),
        BLOCK_K=triton.next_power_of_2(top_k), num_warps=4)
    return weights, ids
