"""SPECULATIVE: one complete captured generation round per call.

1. Proposals: the draft model runs D one-token steps per lane from the pending token, drawing
   proposal j from its sampling distribution (the lane's own logit bias, penalties, temperature,
   filters and mask row) at counter ``position + j`` - or taking the request's copied history
   candidate j where the host supplied one (history drafting), teacher-forcing the draft with it.
   Confidence j is the softmax probability of proposal j under the draft's biased logits.
2. Lengths: exact host lengths (``lane_tokens`` bound to QUERY_LENGTH), or device allocation of
   causal prefixes within P from the confidence (``lane_tokens`` bound to SPECULATIVE_PREFIX_LIMIT:
   immutable ceilings, ``helios::allocate_prefixes``). Lengths outside the lane limit or the packed
   capacity reject the cohort: every length is 0 and nothing is committed. With tensor parallelism
   every rank runs the whole draft and allocates from rank zero's confidence (``helios::broadcast``
   before allocation), so all ranks verify the same prefixes.
3. Verification: the target runs the pending token and each lane's proposals packed into P
   positions; ``helios::verify_proposals`` accepts by rejection sampling against the target's
   sampling weights (greedy lanes: the longest prefix that matches the target's argmax) and emits
   the accepted proposals plus one corrected or bonus token. The lane's logit bias
   (``logit_bias_ids`` / ``logit_bias_values``, per slot, as plain programs take them) is added
   to the target's logits at every position before penalties, filters and the grammar mask, as
   plain sampling adds it, so acceptance and the corrected or bonus token follow the biased
   distribution. Every position (and every proposal) applies the lane's mask row, as plain
   programs apply every row's: an unconstrained lane's clears the vocabulary's excluded ids (an
   image sentinel inside the sampled range), which a round verified past position 0 when only
   the first applied it; a constrained lane verifies position 0 alone (a single lane).
4. Commit: the draft writes its keys/values of the last accepted input (the pending token when none
   was accepted), so its context covers every consumed token (completion cursor lag 0); output
   counts grow by the emitted tokens; the completion record reports offered (= length), accepted,
   emitted and the emitted ids.

The token-logprobs variant (`ProgramOptions.token_logprobs`) also returns the log-probability of
every emitted token and its most probable alternatives (`SpeculativeProgram.emitted_logprobs`).

A width-one program (D = 0) draws no proposals: it is DECODE plus the draft's commit step, which
preserves the draft context for wider rounds. Penalty counts at verification position j include
proposals 1..j, exactly what ordinary decoding would count had they been emitted, so a draft equal
to the target reproduces ordinary decoding token for token - sampled lanes too (without history
candidates); a lane's logit bias keeps that (greedy lanes' tokens are plain decoding's whatever the
draft; sampled lanes follow the biased distribution).

Mutation: target and draft cache planes (in place), output_counts (index_put_ with accumulation).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

import helios.abi.collectives  # noqa: F401  (registers helios::broadcast)
import helios.abi.completion  # noqa: F401  (registers helios::completion_record)
import helios.abi.speculative  # noqa: F401  (registers the speculative ops)
import helios.abi.token_logprobs  # noqa: F401  (registers helios::token_logprobs)
from helios.abi.rng import SAMPLE_OFFSET
from helios.abi.sampling import split_sampling_parameters
from helios.ignition.architecture import Architecture
from helios.ignition.decoder import PackedStep, decoder_hidden, lm_logits, slot_mapping
from helios.ignition.draft import DraftStorage, one_token_step, split_weights, step_logits, write_keys
from helios.ignition.program_spec import Capacity, ProgramOptions, logprob_width, model_weight_layout
from helios.ignition.tensor_parallel import with_logit_bias

_OPS = torch.ops.helios


class Lanes(NamedTuple):
    """Per-lane inputs [B]; `limits` is 0 on inactive rows."""

    request_slots: torch.Tensor
    slots: torch.Tensor  # request_slots clamped to a valid row
    generations: torch.Tensor
    pending: torch.Tensor
    start: torch.Tensor  # position of the pending token
    limits: torch.Tensor  # int64: exact length or ceiling
    active: torch.Tensor


class Controls(NamedTuple):
    """Sampling inputs of the lanes, each [B, ...]."""

    seeds: torch.Tensor
    params: tuple  # (temperature, top_k, top_p, min_p, penalties)
    grammar_mask: torch.Tensor
    prompt_counts: torch.Tensor
    output_counts: torch.Tensor
    bias: tuple[torch.Tensor, torch.Tensor]  # the lanes' logit-bias ids (-1 pads) and values [B, N]


class Proposals(NamedTuple):
    tokens: torch.Tensor  # int64 [B, D]
    weights: torch.Tensor  # float64 [B, D, V]: the distribution each was drawn from
    confidence: torch.Tensor  # float32 [B, D]


def one_hot(tokens: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    ids = torch.arange(vocab, device=tokens.device)
    return (tokens.unsqueeze(-1) == ids).to(dtype)


class SpeculativeProgram(torch.nn.Module):
    """The SPECULATIVE program of one (B, W, P, D) variant; see the module docstring."""

    def __init__(self, arch: Architecture, page_tokens: int, capacity: Capacity, options: ProgramOptions):
        super().__init__()
        if options.draft is None:
            raise ValueError("a SPECULATIVE program needs a draft model")
        self.arch, self.draft, self.page_tokens = arch, options.draft, page_tokens
        self.rows, self.width = capacity.batch_capacity, capacity.verify_tokens
        self.packed, self.drafts = capacity.packed_token_capacity, capacity.draft_tokens
        self.lane_limit = capacity.lane_limit
        self.allocates = options.allocates_prefixes
        self.record_tokens = options.record_tokens
        self.token_logprobs = options.token_logprobs
        self.weight_names = tuple(slot.name for slot in model_weight_layout(arch, options.draft))

    def forward(
        self, weights: list[torch.Tensor], k_cache, v_cache, output_counts, prompt_counts, page_table,
        token_ids, positions, lane_tokens, request_slots, generations, seeds, sampling_params, grammar_mask,
        logit_bias_ids, logit_bias_values, submission, copied_ids, copied_counts, copied_endpoints,
        draft_k_cache, draft_v_cache, draft_page_table,
    ):
        target_weights, draft_weights = split_weights(self.weight_names, weights)
        lanes = self.lanes(token_ids, positions, lane_tokens, request_slots, generations)
        controls = Controls(seeds, split_sampling_parameters(sampling_params), grammar_mask,
                            prompt_counts[lanes.slots], output_counts[lanes.slots],
                            (logit_bias_ids[lanes.slots], logit_bias_values[lanes.slots]))
        draft = DraftStorage(draft_k_cache, draft_v_cache, draft_page_table[lanes.slots])
        proposals = self.propose(draft_weights, draft, lanes, controls, (copied_ids, copied_counts, copied_endpoints))
        lengths = self.lengths(proposals, lanes)
        sequence = torch.cat((lanes.pending.unsqueeze(-1), proposals.tokens.clamp(min=0)), dim=1)
        target = (k_cache, v_cache, page_table[lanes.slots])
        emitted, accepted, scores = self.verify(target_weights, target, lanes, controls, (sequence, proposals), lengths)
        self.commit_draft(draft_weights, draft, lanes, sequence, accepted, lengths)
        counted = (emitted >= 0).to(output_counts.dtype)
        output_counts.index_put_((lanes.slots.unsqueeze(-1).expand_as(emitted), emitted.clamp(min=0)),
                                 counted, accumulate=True)
        record = self.record(lanes, submission, lengths, emitted, accepted)
        return ((record, proposals.confidence) if self.drafts else (record,)) + scores

    def lanes(self, token_ids, positions, lane_tokens, request_slots, generations) -> Lanes:
        active = request_slots >= 0
        limits = torch.where(active, lane_tokens.to(torch.int64), 0)
        return Lanes(request_slots, request_slots.clamp(min=0), generations, token_ids, positions, limits, active)

    # -- 1. proposals ----------------------------------------------------------------------------

    def propose(self, weights, draft: DraftStorage, lanes: Lanes, controls: Controls, copied) -> Proposals:
        rows, vocab = self.rows, self.arch.vocab_size
        copied_ids, copied_counts, copied_endpoints = copied
        copy_valid = lanes.active & (copied_endpoints == lanes.start)
        num_copied = torch.where(copy_valid, copied_counts.to(torch.int64), 0)
        token, counts = lanes.pending, controls.output_counts
        tokens, distributions, confidence = [], [], []
        mask_rows = every_row(rows, token.device)
        for offset in range(self.drafts):
            writable = lanes.active & (offset < lanes.limits)
            step = one_token_step(token, lanes.start + offset, draft.table_rows, writable, self.page_tokens)
            logits = with_logit_bias(step_logits(self.draft, weights, draft, step), *controls.bias)
            q = self.sampling_weights(logits, controls, counts, controls.grammar_mask, mask_rows)
            drawn = _OPS.draw_weighted(q, controls.seeds, lanes.start + offset + 1, SAMPLE_OFFSET)
            use_copied = offset < num_copied
            candidate = copied_ids[:, offset].clamp(0, vocab - 1)
            proposal = torch.where(use_copied, candidate, drawn)
            q = torch.where(use_copied.unsqueeze(-1), one_hot(candidate, vocab, q.dtype), q)
            confidence.append(torch.softmax(logits, dim=-1).gather(1, proposal.clamp(min=0).unsqueeze(-1)).squeeze(-1))
            counts = counts + one_hot(proposal, vocab, counts.dtype)
            tokens.append(proposal)
            distributions.append(q)
            token = proposal.clamp(min=0)
        if not tokens:
            empty = lanes.pending.new_zeros((rows, 0))
            return Proposals(empty, torch.zeros((rows, 0, vocab), dtype=torch.float64, device=empty.device),
                             torch.zeros((rows, 0), dtype=torch.float32, device=empty.device))
        return Proposals(torch.stack(tokens, 1), torch.stack(distributions, 1), torch.stack(confidence, 1))

    @staticmethod
    def sampling_weights(logits, controls: Controls, output_counts, grammar_mask, mask_rows) -> torch.Tensor:
        temperature, top_k, top_p, min_p, penalties = controls.params
        return _OPS.sampling_weights(logits, temperature, top_k, top_p, min_p, penalties,
                                     controls.prompt_counts, output_counts, grammar_mask, mask_rows)

    # -- 2. lengths ------------------------------------------------------------------------------

    def lengths(self, proposals: Proposals, lanes: Lanes) -> torch.Tensor:
        """int64 [B] target positions per lane; all 0 when the host's values are out of range."""
        limits = lanes.limits
        in_range = ((limits >= 0) & (limits <= self.lane_limit)).all()
        if self.allocates and self.drafts:
            confidence = proposals.confidence
            if self.arch.tensor_parallel > 1:  # rank zero's confidence decides for every rank
                confidence = torch.ops.helios.broadcast(confidence, self.arch.tensor_parallel, 0)
            lengths = _OPS.allocate_prefixes(confidence, limits.to(torch.int32), self.packed).to(torch.int64)
        else:
            lengths = limits
            in_range &= limits.sum() <= self.packed
        return torch.where(in_range, lengths, 0)

    # -- 3. verification -------------------------------------------------------------------------

    def verify(self, weights, target, lanes: Lanes, controls: Controls, proposed, lengths):
        """(emitted int64 [B, W], accepted int64 [B], scores) after running the target over the
        proposals; `scores` is `emitted_logprobs` of a token-logprobs variant, else empty."""
        sequence, proposals = proposed
        k_cache, v_cache, table_rows = target
        step, rect = self.packed_step(sequence, lanes.start, lengths, table_rows)
        logits = lm_logits(self.arch, weights, decoder_hidden(self.arch, weights, k_cache, v_cache, step))[rect]
        rows, width, vocab = self.rows, self.width, self.arch.vocab_size
        # Every verify position samples with its lane's bias, as a plain program's row does (added
        # to the logits before penalties, filters and the grammar mask; the scores read it too).
        bias = tuple(values.repeat_interleave(width, dim=0) for values in controls.bias)
        logits = with_logit_bias(logits, *bias)
        counts_dtype = controls.output_counts.dtype
        drafted = one_hot(proposals.tokens, vocab, counts_dtype).cumsum(dim=1, dtype=counts_dtype)
        before = torch.cat((drafted.new_zeros((rows, 1, vocab)), drafted), dim=1)  # [B, D + 1, V]
        index = torch.arange(width, device=lengths.device).clamp(max=self.drafts)
        counts = (controls.output_counts.unsqueeze(1) + before[:, index]).reshape(rows * width, vocab)
        repeated = Controls(controls.seeds, tuple(p.repeat_interleave(width, dim=0) for p in controls.params),
                            controls.grammar_mask.repeat_interleave(width, dim=0),
                            controls.prompt_counts.repeat_interleave(width, dim=0), counts, bias)
        # Every position applies its lane's mask row, as a plain program applies every row's: an
        # unconstrained lane's clears the vocabulary's excluded ids (an image sentinel), which no
        # verified position may emit either; a constrained lane is a single lane (width one), its
        # grammar's mask is that of position 0, the one it verifies.
        masked = every_row(rows * width, lengths.device)
        target_weights = self.sampling_weights(logits, repeated, counts, repeated.grammar_mask, masked)
        target_weights = target_weights.reshape(rows, width, vocab)
        counters = lanes.start + 1
        if self.drafts:
            emitted, accepted = _OPS.verify_proposals(target_weights, proposals.tokens, proposals.weights, lengths,
                                                      controls.seeds, counters)
        else:
            token = _OPS.draw_weighted(target_weights[:, 0], controls.seeds, counters, SAMPLE_OFFSET)
            emitted, accepted = torch.where(lengths > 0, token, -1).unsqueeze(-1), torch.zeros_like(lengths)
        scores = self.emitted_logprobs(logits, emitted, repeated, masked) if self.token_logprobs else ()
        return emitted, accepted, scores

    def emitted_logprobs(self, logits, emitted, repeated: Controls, masked) -> tuple[torch.Tensor, ...]:
        """``helios::token_logprobs`` of every emitted token, [B, W] and [B, W, K] (the outputs of a
        token-logprobs variant, see `helios.ignition.program_spec`). Emitted token j is scored under
        the target's distribution at position j (accepted proposal or corrected token alike; a
        correction is drawn from the residual, but its value is the target's): the target's logits
        there with the lane's logit bias (plain programs score the biased logits too), penalty
        counts including proposals 0..j-1, the lane's mask row at every position (the excluded ids
        cleared; a constrained lane is a single lane, width one) - what a DECODE step would score
        it under had the lane decoded those tokens one by one, so a request's values do not depend
        on whether its tokens came from speculation. Positions past a lane's last emitted token
        score token -1 (-inf, as a row that samples nothing)."""
        rows, width = self.rows, self.width
        tokens = torch.cat((emitted, emitted.new_full((rows, width - emitted.shape[1]), -1)), dim=1)
        penalties = repeated.params[4]
        chosen, top_ids, top_values = _OPS.token_logprobs(
            logits, tokens.reshape(-1), penalties, repeated.prompt_counts, repeated.output_counts,
            repeated.grammar_mask, masked, logprob_width(self.arch))
        return chosen.reshape(rows, width), top_ids.reshape(rows, width, -1), top_values.reshape(rows, width, -1)

    def packed_step(self, sequence, start, lengths, table_rows) -> tuple[PackedStep, torch.Tensor]:
        """The P packed target tokens (lane b: sequence[b, :lengths[b]]) and, per (lane, position)
        of the [B, W] rectangle, the packed row holding it (clamped into range past a lane's end).

        Every packed token is its own one-token attention row carrying its lane's page table: its
        keys are written before attention and it attends causally to cached positions up to its
        own, exactly as inside a multi-token row, and one-token rows attend in one batched pass.
        """
        device = lengths.device
        zero = torch.zeros(1, dtype=torch.int32, device=device)
        lane_start = torch.cat((zero, torch.cumsum(lengths, 0).to(torch.int32)))
        index = torch.arange(self.packed, device=device, dtype=torch.int32)
        lanes = torch.searchsorted(lane_start[1:].contiguous(), index, right=True).clamp(max=self.rows - 1)
        offset = (index - lane_start[lanes]).to(torch.int64)
        is_packed = index < lane_start[self.rows]
        tokens = torch.where(is_packed, sequence[lanes, offset.clamp(0, sequence.shape[1] - 1)], 0)
        positions = torch.where(is_packed, start[lanes] + offset, 0)
        token_rows = torch.arange(self.packed + 1, dtype=torch.int32, device=device)
        tables = table_rows[lanes]
        slots = slot_mapping(token_rows, tables, positions, self.page_tokens)
        step = PackedStep(tokens, positions, token_rows, tables, torch.where(is_packed, slots, -1))
        column = torch.arange(self.width, device=device)
        rect = (lane_start[:-1].to(torch.int64).unsqueeze(-1) + column).clamp(max=self.packed - 1)
        return step, rect.reshape(-1)

    # -- 4. commit -------------------------------------------------------------------------------

    def commit_draft(self, weights, draft: DraftStorage, lanes: Lanes, sequence, accepted, lengths) -> None:
        """The draft's keys/values of the last accepted input, at its position."""
        writable = lanes.active & (lengths > 0)
        last = sequence.gather(1, accepted.clamp(max=sequence.shape[1] - 1).unsqueeze(-1)).squeeze(-1)
        step = one_token_step(last, lanes.start + accepted, draft.table_rows, writable, self.page_tokens)
        write_keys(self.draft, weights, draft, step)

    def record(self, lanes: Lanes, submission, lengths, emitted, accepted) -> torch.Tensor:
        live = lengths > 0
        last = emitted.gather(1, accepted.unsqueeze(-1)).squeeze(-1)
        record = _OPS.completion_record(
            lanes.request_slots, lanes.generations, submission.reshape(()), torch.where(live, last, -1),
            lengths, accepted, torch.where(live, accepted + 1, 0),
            torch.where(live, lanes.start + accepted + 1, 0), 0,
        )
        return with_emitted(record, emitted, self.record_tokens)


def every_row(rows: int, device) -> torch.Tensor:
    """``mask_rows`` applying each row's grammar-mask row (bool [rows], all True)."""
    return torch.ones((rows,), dtype=torch.bool, device=device)


def with_emitted(record: torch.Tensor, emitted: torch.Tensor, record_tokens: int) -> torch.Tensor:
    """The record with `record_tokens` emitted-id columns appended (-1 padded); unchanged for 0."""
    if not record_tokens:
        return record
    emitted = emitted[:, :record_tokens]
    padding = emitted.new_full((emitted.shape[0], record_tokens - emitted.shape[1]), -1)
    return torch.cat((record, emitted, padding), dim=1)
