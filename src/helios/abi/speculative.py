"""Speculative generation ops (namespace ``helios``): sampling weights, weighted draws, proposal
verification by rejection sampling, and device prefix allocation from proposal confidence.

A SPECULATIVE program calls them inside one captured graph (proposals, allocation, verification,
commit). Each has a pure-tensor reference registered for every device, and a fake implementation
that gives shapes only, so a saved program depends on the schemas alone. Off the CPU (see
`helios.abi.sampling.selective`) the references never read device data on the host and create no
host tensors, so they can be captured into a CUDA graph; on the CPU, draws skip Philox for rows
whose outcome no uniform decides. On CUDA the weights and every weighted draw (verification's
included) select instead of sorting (`helios.abi.triton_draws`), as ``helios::sample`` does there:
the same kept tokens and draws up to the rounding of sums taken in another order.

``helios::sampling_weights(logits, temperature, top_k, top_p, min_p, penalties, prompt_counts,
output_counts, grammar_mask, mask_rows) -> Tensor``
    float64 [R, V]: the distribution ``helios::sample`` draws a row's token from, as unnormalised
    weights in vocabulary order. Steps 1-7 of `helios.abi.sampling` (penalties, grammar mask,
    temperature, top-k/top-p/min-p); kept tokens carry their softmax probability, others 0. A
    greedy row (temperature <= 0 or NaN) is one-hot at its argmax (lowest id on ties); a row with
    no allowed token is all zeros.

``helios::draw_weighted(weights, seeds, counters, int offset) -> Tensor``
    int64 [R]: inverse-CDF draw from non-negative weights [R, V] in canonical order (weight
    descending, id ascending) with u = `uniform53` at (seed, counter, offset); NO_TOKEN (-1) for a
    row without positive weight. ``draw_weighted(sampling_weights(x...), s, c, SAMPLE_OFFSET)``
    equals ``sample(x..., s, c)`` bit for bit: the same weights, order, sums and uniform (on CUDA,
    where both select, up to the rounding of their sums).

``helios::verify_proposals(target_weights, proposals, proposal_weights, lengths, seeds, counters)
-> (Tensor emitted, Tensor accepted)``
    B lanes; target_weights float64 [B, W, V] (position j: the target distribution of the token
    after the pending token and proposals 1..j); proposals int64 [B, D]; proposal_weights float64
    [B, D, V] (the distribution each proposal was drawn from; a copied candidate is one-hot);
    lengths int64 [B] (target positions verified, pending included, <= min(D + 1, W); 0 =
    inactive); seeds, counters int64 [B] (counter of position 0; position j uses counter + j).
    Proposal j (j < length - 1) is accepted while u_j * q_j(t) < p_j(t) (normalised; u_j at
    offset `ACCEPT_OFFSET`). At the first rejection k the lane emits a draw from
    normalise(max(0, p_k - q_k)) at offset `RESIDUAL_OFFSET` (from p_k if that has no mass); when
    every verified proposal is accepted it emits the bonus draw from p_k at `SAMPLE_OFFSET`.
    Returns emitted int64 [B, W] (accepted proposals, then that token; -1 after) and accepted
    int64 [B]. Output tokens follow the target distribution exactly (standard speculative
    sampling); greedy lanes (one-hot weights) keep the longest prefix that matches the target's
    argmax. Draws at an unreached position are never consumed by anything emitted.

``helios::allocate_prefixes(confidence, ceilings, int capacity) -> Tensor``
    int32 [B] lane lengths from FP32 confidence [B, D] (confidence j: the chance proposal j
    survives verification) and int32 ceilings [B] (0 = inactive). Every active lane starts with
    its pending position; then, while positions of the capacity P remain, the lane whose
    immediate frontier (next proposal) has the highest survival probability - the FP64 product of
    its FP32 confidences 1..j - gains it, within its ceiling. Ties prefer shorter prefixes, then
    lower submission rows. Because survival products never grow along a lane, this equals taking
    candidates in (survival desc, prefix asc, row asc) order, and a later confidence can never
    admit a proposal whose predecessor was not admitted. No random draws are consumed. The cohort
    is rejected (every length 0, so the host's completion check fails the round and nothing is
    committed) when a confidence is not a finite value in [0, 1], a ceiling lies outside
    [0, D + 1], or the active lanes alone exceed P.
"""

from __future__ import annotations

import torch

from helios.abi import sampling
from helios.abi.grammar import check_mask_args, disallowed
from helios.abi.op_library import abi_op
from helios.abi.registry import AbiArgumentError, check_same_device, check_tensor
from helios.abi.rng import SAMPLE_OFFSET, philox_words, uniform53
from helios.abi.sampling import NO_TOKEN, NUM_PENALTIES, apply_penalties, keep_prefix

ACCEPT_OFFSET = 1  # u_j of the acceptance test of proposal j
RESIDUAL_OFFSET = 2  # the draw from the residual distribution after a rejection

SAMPLING_WEIGHTS_SCHEMA = (
    "(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, Tensor penalties, "
    "Tensor prompt_counts, Tensor output_counts, Tensor grammar_mask, Tensor mask_rows) -> Tensor"
)
DRAW_WEIGHTED_SCHEMA = "(Tensor weights, Tensor seeds, Tensor counters, int offset) -> Tensor"
VERIFY_PROPOSALS_SCHEMA = (
    "(Tensor target_weights, Tensor proposals, Tensor proposal_weights, Tensor lengths, Tensor seeds, "
    "Tensor counters) -> (Tensor, Tensor)"
)
ALLOCATE_PREFIXES_SCHEMA = "(Tensor confidence, Tensor ceilings, int capacity) -> Tensor"
_WEIGHTS, _DRAW = "helios::sampling_weights", "helios::draw_weighted"
_VERIFY, _ALLOCATE = "helios::verify_proposals", "helios::allocate_prefixes"
_NEG_INF = float("-inf")
_F32_MAX = torch.finfo(torch.float32).max
_F64_MAX = torch.finfo(torch.float64).max


# -- sampling weights --------------------------------------------------------------------------

def _check_weights_args(logits, controls, penalties, counts, grammar_mask, mask_rows) -> int:
    num_rows, vocab = check_mask_args(_WEIGHTS, logits, grammar_mask, mask_rows)
    check_tensor(_WEIGHTS, "logits", logits, torch.float32, (num_rows, vocab))
    for name, tensor, dtype in zip(("temperature", "top_k", "top_p", "min_p"), controls,
                                   (torch.float32, torch.int32, torch.float32, torch.float32)):
        check_tensor(_WEIGHTS, name, tensor, dtype, (num_rows,))
    check_tensor(_WEIGHTS, "penalties", penalties, torch.float32, (num_rows, NUM_PENALTIES))
    check_tensor(_WEIGHTS, "prompt_counts", counts[0], torch.int32, (num_rows, vocab))
    check_tensor(_WEIGHTS, "output_counts", counts[1], torch.int32, (num_rows, vocab))
    check_same_device(_WEIGHTS, dict(logits=logits, penalties=penalties, prompt_counts=counts[0],
                                     output_counts=counts[1], temperature=controls[0]))
    return num_rows


def _finite_or_neg_inf(values: torch.Tensor, posinf: float) -> torch.Tensor:
    return torch.nan_to_num(values, nan=_NEG_INF, posinf=posinf, neginf=_NEG_INF)


def sampling_weights_reference(logits, controls, penalties, counts, grammar_mask, mask_rows) -> torch.Tensor:
    """`helios::sampling_weights` on validated inputs; controls = (temperature, top_k, top_p, min_p).
    Computed in row blocks (`helios.abi.sampling.row_blocks`: a dozen float64 temporaries the size of
    a block, whatever the rows), written into the one output."""
    blocks = sampling.row_blocks(*logits.shape)
    if len(blocks) <= 1:
        return _weights_rows(logits, controls, penalties, counts, grammar_mask, mask_rows)
    weights = logits.new_empty(logits.shape, dtype=torch.float64)
    for rows in blocks:
        weights[rows] = _weights_rows(logits[rows], tuple(control[rows] for control in controls), penalties[rows],
                                      (counts[0][rows], counts[1][rows]), grammar_mask[rows], mask_rows[rows])
    return weights


def _weights_rows(logits, controls, penalties, counts, grammar_mask, mask_rows) -> torch.Tensor:
    temperature, top_k, top_p, min_p = controls
    values = _finite_or_neg_inf(logits.to(torch.float64), _F32_MAX)
    values = apply_penalties(values, penalties, counts[0], counts[1])
    values = values.masked_fill(disallowed(grammar_mask, mask_rows, logits.shape[1]), _NEG_INF)
    values = _finite_or_neg_inf(values, _F64_MAX)
    has_candidate = values.amax(dim=-1) > _NEG_INF
    greedy = torch.zeros_like(values).scatter(1, values.argmax(dim=-1, keepdim=True), 1.0)
    drawing = temperature > 0
    scale = torch.where(drawing, temperature, 1.0).to(torch.float64).unsqueeze(-1)
    probs = torch.softmax(_finite_or_neg_inf(values / scale, _F64_MAX), dim=-1)
    sorted_probs, sorted_ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    kept = torch.where(keep_prefix(sorted_probs, top_k, top_p, min_p), sorted_probs, 0.0)
    weights = torch.zeros_like(probs).scatter(1, sorted_ids, kept)
    weights = torch.where(drawing.unsqueeze(-1), weights, greedy)
    return torch.where(has_candidate.unsqueeze(-1), weights, 0.0)


@abi_op(_WEIGHTS, mutates_args=(), schema=SAMPLING_WEIGHTS_SCHEMA)
def sampling_weights(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                     top_p: torch.Tensor, min_p: torch.Tensor, penalties: torch.Tensor,
                     prompt_counts: torch.Tensor, output_counts: torch.Tensor,
                     grammar_mask: torch.Tensor, mask_rows: torch.Tensor) -> torch.Tensor:
    """float64 [R, V] sampling weights; see the module docstring."""
    controls, counts = (temperature, top_k, top_p, min_p), (prompt_counts, output_counts)
    _check_weights_args(logits, controls, penalties, counts, grammar_mask, mask_rows)
    return sampling_weights_reference(logits, controls, penalties, counts, grammar_mask, mask_rows)


@sampling_weights.register_kernel("cuda")
def _sampling_weights_cuda(logits, temperature, top_k, top_p, min_p, penalties, prompt_counts, output_counts,
                           grammar_mask, mask_rows):
    """Steps 1-4 in `helios.abi.triton_sampling`'s fused pass, the kept prefixes selected without a
    sort (`helios.abi.triton_draws.kept_weights`), in row blocks like the reference."""
    from helios.abi.triton_draws import kept_weights
    from helios.abi.triton_sampling import greedy_tokens

    controls, counts = (temperature, top_k, top_p, min_p), (prompt_counts, output_counts)
    _check_weights_args(logits, controls, penalties, counts, grammar_mask, mask_rows)
    weights = torch.empty(logits.shape, dtype=torch.float64, device=logits.device)
    for rows in sampling.row_blocks(*logits.shape):
        values = weights[rows]
        greedy = greedy_tokens(logits[rows], penalties[rows], prompt_counts[rows], output_counts[rows],
                               grammar_mask[rows], mask_rows[rows], values_out=values)
        drawing = (temperature[rows] > 0) & (greedy >= 0)
        kept_weights(values, greedy, drawing, temperature[rows], top_k[rows], top_p[rows], min_p[rows])
    return weights


@sampling_weights.register_fake
def _sampling_weights_fake(logits, temperature, top_k, top_p, min_p, penalties, prompt_counts,
                           output_counts, grammar_mask, mask_rows):
    controls, counts = (temperature, top_k, top_p, min_p), (prompt_counts, output_counts)
    _check_weights_args(logits, controls, penalties, counts, grammar_mask, mask_rows)
    return logits.new_empty(logits.shape, dtype=torch.float64)


# -- weighted draws ----------------------------------------------------------------------------

def _check_draw_args(op: str, weights, seeds, counters) -> int:
    check_tensor(op, "weights", weights, torch.float64, (None, None))
    num_rows = weights.shape[0]
    check_tensor(op, "seeds", seeds, torch.int64, (num_rows,))
    check_tensor(op, "counters", counters, torch.int64, (num_rows,))
    check_same_device(op, dict(weights=weights, seeds=seeds, counters=counters))
    return num_rows


def uniforms(seeds: torch.Tensor, counters: torch.Tensor, offset: int, needed: torch.Tensor) -> torch.Tensor:
    """`uniform53` at (seed, counter, offset) on the `needed` rows, 0 elsewhere.

    Where `sampling.selective` holds (the CPU) only the needed rows run Philox (a data-dependent
    selection, as in ``helios::sample``); elsewhere every row does and the rest are masked, without
    reading device data on the host. Results are the same.
    """
    if not sampling.selective(seeds.device):
        return torch.where(needed, uniform53(philox_words(seeds, counters, offset)), 0.0)
    values = torch.zeros(seeds.shape, dtype=torch.float64, device=seeds.device)
    rows = needed.nonzero().squeeze(-1)
    if rows.numel():
        values[rows] = uniform53(philox_words(seeds[rows], counters[rows], offset))
    return values


def draw_selected(weights: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor, offset: int) -> torch.Tensor:
    """`helios::draw_weighted` on CUDA: `helios.abi.triton_draws.draw_from_weights` (selection, no
    sort) in row blocks. A row with one positive weight gets it whatever its uniform, as in the
    reference, which skips that uniform; the masses are summed in another order than the
    reference's prefix sums, so a token differs only where rounding moves a boundary comparison."""
    from helios.abi.triton_draws import draw_from_weights

    tokens = [draw_from_weights(weights[rows], uniform53(philox_words(seeds[rows], counters[rows], offset)))
              for rows in sampling.row_blocks(*weights.shape)]
    return tokens[0] if len(tokens) == 1 else torch.cat(tokens)


def draw_reference(weights: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor, offset: int) -> torch.Tensor:
    """`helios::draw_weighted` on validated inputs (the inverse CDF of `helios.abi.sampling`, step 8).

    A row with a single positive weight (a greedy row) needs no random number. Rows are drawn in
    blocks (`helios.abi.sampling.row_blocks`), as the weights were computed.
    """
    blocks = sampling.row_blocks(*weights.shape)
    if len(blocks) <= 1:
        return _draw_rows(weights, seeds, counters, offset)
    return torch.cat([_draw_rows(weights[rows], seeds[rows], counters[rows], offset) for rows in blocks])


def _draw_rows(weights: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor, offset: int) -> torch.Tensor:
    sorted_weights, sorted_ids = torch.sort(weights, dim=-1, descending=True, stable=True)
    cumulative = sorted_weights.cumsum(dim=-1)
    random = sorted_weights[:, 1] > 0 if weights.shape[1] > 1 else torch.zeros_like(seeds, dtype=torch.bool)
    target = uniforms(seeds, counters, offset, random) * cumulative[:, -1]
    position = (cumulative <= target.unsqueeze(-1)).sum(dim=-1)
    last_drawable = ((sorted_weights > 0).sum(dim=-1) - 1).clamp(min=0)
    token = sorted_ids.gather(1, torch.minimum(position, last_drawable).unsqueeze(-1)).squeeze(-1)
    return torch.where(cumulative[:, -1] > 0, token, NO_TOKEN)


@abi_op(_DRAW, mutates_args=(), schema=DRAW_WEIGHTED_SCHEMA)
def draw_weighted(weights: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor, offset: int) -> torch.Tensor:
    """int64 [R] tokens drawn from weights [R, V]; see the module docstring."""
    _check_draw_args(_DRAW, weights, seeds, counters)
    return draw_reference(weights, seeds, counters, offset)


@draw_weighted.register_kernel("cuda")
def _draw_weighted_cuda(weights: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor, offset: int) -> torch.Tensor:
    _check_draw_args(_DRAW, weights, seeds, counters)
    return draw_selected(weights, seeds, counters, offset)


@draw_weighted.register_fake
def _draw_weighted_fake(weights, seeds, counters, offset):
    return seeds.new_empty((_check_draw_args(_DRAW, weights, seeds, counters),))


# -- verification ------------------------------------------------------------------------------

def _check_verify_args(target_weights, proposals, proposal_weights, lengths, seeds, counters) -> None:
    check_tensor(_VERIFY, "target_weights", target_weights, torch.float64, (None, None, None))
    rows, _, vocab = target_weights.shape
    check_tensor(_VERIFY, "proposals", proposals, torch.int64, (rows, None))
    check_tensor(_VERIFY, "proposal_weights", proposal_weights, torch.float64, (rows, proposals.shape[1], vocab))
    for name, tensor in (("lengths", lengths), ("seeds", seeds), ("counters", counters)):
        check_tensor(_VERIFY, name, tensor, torch.int64, (rows,))
    check_same_device(_VERIFY, dict(target_weights=target_weights, proposals=proposals,
                                    proposal_weights=proposal_weights, lengths=lengths, seeds=seeds))


def _normalised(weights: torch.Tensor) -> torch.Tensor:
    total = weights.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weights / torch.where(total > 0, total, 1.0), 0.0)


def _acceptances(p, q, proposals, lengths, seeds, counters) -> torch.Tensor:
    """Accepted proposals per lane: the leading run of u_j * q_j(t_j) < p_j(t_j) below length - 1."""
    rows, num_checked = proposals.shape
    index = torch.arange(num_checked, device=proposals.device)
    tokens = proposals.clamp(min=0).unsqueeze(-1)
    p_token = p.gather(2, tokens).squeeze(-1)
    q_token = q.gather(2, tokens).squeeze(-1)
    flat_counters = (counters.unsqueeze(-1) + index).reshape(-1)
    flat_seeds = seeds.unsqueeze(-1).expand(rows, num_checked).reshape(-1)
    # u only decides where 0 < p(t) < q(t): p(t) >= q(t) accepts and p(t) = 0 rejects for any u < 1
    undecided = ((p_token > 0) & (p_token < q_token)).reshape(-1)
    uniform = uniforms(flat_seeds, flat_counters, ACCEPT_OFFSET, undecided).reshape(rows, num_checked)
    passed = (uniform * q_token < p_token) & (proposals >= 0) & (index < (lengths - 1).unsqueeze(-1))
    return passed.to(torch.int64).cumprod(dim=1).sum(dim=1)


def verify_reference(target_weights, proposals, proposal_weights, lengths, seeds, counters, draw=draw_reference):
    """`helios::verify_proposals` on validated inputs: (emitted [B, W], accepted [B]); `draw` is
    `helios::draw_weighted`'s implementation for the bonus and residual draws."""
    rows, width, _ = target_weights.shape
    checked = min(width - 1, proposals.shape[1])
    lanes = torch.arange(rows, device=proposals.device)
    p = _normalised(target_weights)
    accepted = torch.zeros_like(lengths)
    residual = torch.zeros_like(target_weights[:, 0])
    if checked > 0:
        q = _normalised(proposal_weights[:, :checked])
        accepted = _acceptances(p[:, :checked], q, proposals[:, :checked], lengths, seeds, counters)
        at = accepted.clamp(max=checked - 1)
        residual = (p[lanes, at] - q[lanes, at]).clamp(min=0.0)
    position = accepted.clamp(max=width - 1)
    rejected = (accepted < lengths - 1) & (residual.sum(dim=-1) > 0)
    bonus = draw(target_weights[lanes, position], seeds, counters + position, SAMPLE_OFFSET)
    corrected = draw(residual, seeds, counters + position, RESIDUAL_OFFSET)
    last = torch.where(rejected, corrected, bonus)
    index = torch.arange(width, device=proposals.device)
    drafted = torch.full((rows, width), NO_TOKEN, dtype=torch.int64, device=proposals.device)
    if checked > 0:
        drafted[:, :checked] = proposals[:, :checked]
    emitted = torch.where(index < accepted.unsqueeze(-1), drafted, NO_TOKEN)
    emitted = torch.where(index == accepted.unsqueeze(-1), last.unsqueeze(-1), emitted)
    active = lengths > 0
    return torch.where(active.unsqueeze(-1), emitted, NO_TOKEN), torch.where(active, accepted, 0)


@abi_op(_VERIFY, mutates_args=(), schema=VERIFY_PROPOSALS_SCHEMA)
def verify_proposals(target_weights: torch.Tensor, proposals: torch.Tensor, proposal_weights: torch.Tensor,
                     lengths: torch.Tensor, seeds: torch.Tensor, counters: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(emitted int64 [B, W], accepted int64 [B]); see the module docstring."""
    _check_verify_args(target_weights, proposals, proposal_weights, lengths, seeds, counters)
    return verify_reference(target_weights, proposals, proposal_weights, lengths, seeds, counters)


@verify_proposals.register_kernel("cuda")
def _verify_proposals_cuda(target_weights, proposals, proposal_weights, lengths, seeds, counters):
    _check_verify_args(target_weights, proposals, proposal_weights, lengths, seeds, counters)
    return verify_reference(target_weights, proposals, proposal_weights, lengths, seeds, counters, draw_selected)


@verify_proposals.register_fake
def _verify_proposals_fake(target_weights, proposals, proposal_weights, lengths, seeds, counters):
    _check_verify_args(target_weights, proposals, proposal_weights, lengths, seeds, counters)
    rows, width, _ = target_weights.shape
    return proposals.new_empty((rows, width)), proposals.new_empty((rows,))


# -- prefix allocation -------------------------------------------------------------------------

def _check_allocate_args(confidence, ceilings, capacity) -> None:
    check_tensor(_ALLOCATE, "confidence", confidence, torch.float32, (None, None))
    check_tensor(_ALLOCATE, "ceilings", ceilings, torch.int32, (confidence.shape[0],))
    check_same_device(_ALLOCATE, dict(confidence=confidence, ceilings=ceilings))
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise AbiArgumentError(f"{_ALLOCATE}: capacity must be a positive int, got {capacity!r}")


def allocate_reference(confidence: torch.Tensor, ceilings: torch.Tensor, capacity: int) -> torch.Tensor:
    """`helios::allocate_prefixes` on validated inputs (vectorised: no data-dependent branches)."""
    rows, drafts = confidence.shape
    ceilings = ceilings.to(torch.int64)
    active = ceilings > 0
    valid = (torch.isfinite(confidence) & (confidence >= 0) & (confidence <= 1)).all()
    valid &= ((ceilings >= 0) & (ceilings <= drafts + 1)).all() & (active.sum() <= capacity)
    survival = torch.nan_to_num(confidence.to(torch.float64), nan=0.0).cumprod(dim=1)
    draft = torch.arange(drafts, device=confidence.device)
    eligible = (draft.unsqueeze(0) + 2 <= ceilings.unsqueeze(-1)).t().reshape(-1)  # prefix-major
    keys = torch.where(eligible, survival.t().reshape(-1), -1.0)
    order = torch.sort(keys, descending=True, stable=True).indices
    in_order = eligible[order]
    budget = capacity - active.sum()
    taken = in_order & (torch.cumsum(in_order.to(torch.int64), 0) <= budget)
    admitted = torch.zeros_like(eligible).scatter(0, order, taken).reshape(drafts, rows).t()
    lengths = active.to(torch.int64) + admitted.to(torch.int64).sum(dim=1)
    return torch.where(valid, lengths, 0).to(torch.int32)


@abi_op(_ALLOCATE, mutates_args=(), schema=ALLOCATE_PREFIXES_SCHEMA)
def allocate_prefixes(confidence: torch.Tensor, ceilings: torch.Tensor, capacity: int) -> torch.Tensor:
    """int32 [B] lane lengths within `capacity`; see the module docstring."""
    _check_allocate_args(confidence, ceilings, capacity)
    return allocate_reference(confidence, ceilings, capacity)


@allocate_prefixes.register_fake
def _allocate_prefixes_fake(confidence, ceilings, capacity):
    _check_allocate_args(confidence, ceilings, capacity)
    return ceilings.new_empty(ceilings.shape)
