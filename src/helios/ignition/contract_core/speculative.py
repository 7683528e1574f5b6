"""SPECULATIVE rounds of a contract-driven program: draft, allocate, verify, commit in one program.

Each lane starts from its device-owned pending token. Its proposals are the runtime's copied
history candidates where it sent some for the lane's generation, continued by the draft model
(`contract_core.model`). Its target length is the host's exact length (QUERY_LENGTH) or, under
SPECULATIVE_PREFIX_LIMIT ceilings, allocated here: every lane gets its pending position, then the
rest of the packed capacity goes to extra positions in row order. The target samples every position
with ``helios::sample`` (counter + position; later positions take the copied per-position grammar
masks where bound); a draft is accepted while it equals the target's token at the position before
it, so the emitted tokens are exactly the target's. Confidence, where the graph returns it, is the
draft model's probability of each proposal.
"""

from __future__ import annotations

import torch

from helios.contract import serving_pb2 as spb
from helios.ignition.contract_core.model import DRAFT_CODES, HEAD

S = spb


def proposals(program, w, x, live, pending) -> tuple[torch.Tensor, torch.Tensor]:
    """(proposals [R, D] int64, draft probabilities [R, D] float32)."""
    rows, draws = pending.shape[0], max(program.layout.draft_tokens, 1)
    codes = w[DRAFT_CODES].to(torch.float32)
    copied = program.value(x, S.VALUE_SOURCE_COPIED_CANDIDATE_IDS)
    count = program.value(x, S.VALUE_SOURCE_COPIED_CANDIDATE_COUNT)
    if copied is not None:
        same = program.value(x, S.VALUE_SOURCE_COPIED_GENERATION).to(torch.int64) == \
            program.value(x, S.VALUE_SOURCE_GENERATION).to(torch.int64)
        count = torch.where(same & live, count.to(torch.int64), torch.zeros_like(pending))
    out, probs, token = [], [], pending
    for j in range(draws):
        scores = codes[token.clamp(0, codes.shape[0] - 1)] @ codes.T
        drafted = torch.argmax(scores, dim=-1)
        if copied is not None and j < copied.shape[1]:
            drafted = torch.where(j < count, copied[:, j].to(torch.int64), drafted)
        probs.append(torch.softmax(scores, -1).gather(1, drafted[:, None])[:, 0])
        out.append(drafted)
        token = drafted
    return torch.stack(out, 1)[:, :draws], torch.stack(probs, 1)[:, :draws].reshape(rows, draws)


def lengths(program, x, live) -> torch.Tensor:
    """Each lane's target positions this round (pending token included)."""
    lay = program.layout
    exact = program.value(x, S.VALUE_SOURCE_QUERY_LENGTH)
    if exact is not None:
        return exact.to(torch.int64) * live
    ceiling = program.value(x, S.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT).to(torch.int64)
    limit = min(lay.draft_tokens + 1, lay.verify_tokens)
    extra = ((ceiling.clamp(min=1, max=limit) - 1) * live)
    budget = lay.packed_tokens - live.to(torch.int64).sum()
    before = torch.cumsum(extra, 0) - extra
    given = torch.minimum((budget - before).clamp(min=0), extra)
    return (1 + given) * live


def speculate(program, w, x):
    lay = program.layout
    live, slots, rows = program.lanes(x)
    state = lay.state
    pending = program.column(x, rows, state.pending)
    drafts, confidence = proposals(program, w, x, live, pending)
    offered = lengths(program, x, live)
    masks = program.value(x, S.VALUE_SOURCE_COPIED_GRAMMAR_MASKS)
    vocab = w[HEAD].shape[0]
    extra = torch.zeros(pending.shape[0], vocab, dtype=torch.int32, device=pending.device)
    inputs = torch.cat((pending[:, None], drafts), 1)
    targets, accepted = [], torch.zeros_like(pending)
    going = live.clone()
    for j in range(lay.verify_tokens):
        mask = program.value(x, S.VALUE_SOURCE_GRAMMAR_MASK) if j == 0 or masks is None else masks[:, j]
        token = program.sample(x, program.logits(w, inputs[:, j]), slots, rows, j, mask, extra)
        targets.append(token)
        if j + 1 >= lay.verify_tokens or j + 1 >= inputs.shape[1]:
            break
        keep = going & (j + 1 < offered) & (inputs[:, j + 1] == token)
        accepted = accepted + keep.to(torch.int64)
        extra = extra.index_put((torch.arange(token.shape[0], device=token.device), token.clamp(min=0)),
                                keep.to(torch.int32), accumulate=True)
        going = keep
    sampled = torch.stack(targets, 1)  # the target's token after each position
    emitted = (accepted + 1) * live
    index = torch.arange(sampled.shape[1], device=sampled.device)
    emitted_ids = torch.where(index < accepted[:, None], _shifted(inputs, sampled.shape[1]), sampled)
    final = sampled.gather(1, accepted[:, None])[:, 0]
    emitted_ids = torch.where(index[None, :] == accepted[:, None], final[:, None], emitted_ids)
    start = program.column(x, rows, state.consumed)
    consumed = start + emitted
    program.put(x, rows, state.pending, final, live)
    program.put(x, rows, state.consumed, consumed, live)
    program.put(x, rows, state.rng, program.column(x, rows, state.rng) + offered, live)
    for j in range(emitted_ids.shape[1]):
        program.count(x, rows, emitted_ids[:, j], live & (j < emitted))
    record = program.record(x, program.value(x, S.VALUE_SOURCE_SLOT), emitted_ids, offered, accepted * live, emitted,
                            torch.where(live, consumed, torch.zeros_like(consumed)))
    if len(lay.outputs) > 1:  # the graph returns proposal confidence
        return record, confidence
    return (record,)


def _shifted(inputs: torch.Tensor, width: int) -> torch.Tensor:
    """The accepted drafts as emitted ids: position j emits the input at j + 1."""
    shifted = inputs[:, 1:width + 1]
    if shifted.shape[1] < width:
        shifted = torch.cat((shifted, inputs[:, -1:].expand(-1, width - shifted.shape[1])), 1)
    return shifted
