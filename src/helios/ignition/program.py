"""The generic captured programs: one `torch.nn.Module` per operation family, built from an Architecture.

The forward signatures are the calling convention declared by `program_spec.ProgramSpec` (capture
checks that the parameter names equal the spec's input names). PREFILL, DECODE and MIXED share one
graph shape: rows of any query length packed into T tokens; they differ only in capacity and in
where a generating lane's pending token comes from (DECODE: `token_ids` per row; MIXED: the row's
`pending_ids` entry replaces its first packed token when >= 0). Every program samples with the ABI
sampling op on the last packed token of each sampling row and ends with `helios::completion_record`;
SCORED_PREFILL also returns the log-probability of given target tokens at every packed position.

Per-request-row inputs (`page_table`, `prompt_counts`) are indexed by `request_slots`, so the host
uploads a slot's page-table entries once, when they are assigned.

In a core with a draft model (`ProgramOptions.draft`) every program also takes the draft inputs
last (``*draft``: its planes and page table, see `helios.ignition.draft`) and writes the draft's
keys/values of the packed tokens. With `ProgramOptions.record_tokens` the completion record carries
the emitted token as its first extra column. With `ProgramOptions.token_logprobs` (a PREFILL, DECODE
or MIXED program's logprob variant) the program also returns ``helios::token_logprobs`` of every
row: the sampled token's log-probability and the `logprob_width` most probable ids with theirs.
A SPECULATIVE program's logprob variant (`helios.ignition.speculative`) returns the same values
for every token a lane emits, from the target distribution at that token's verify position.

A core prepared with startup tuning (`ProgramOptions.attention_tuning`) captures DECODE as
`TunedDecodeProgram`: it also takes ``attention_splits`` and attends with its own entry (a static
index per variant) through ``helios::paged_attention_tuned``; it never writes that buffer.

With `ProgramOptions.device_pending`, DECODE (`DecodeProgram`) also reads and writes
``pending_tokens`` (see `helios.ignition.program_spec`).

With a token-selecting indexer (``arch.indexer``) every program takes ``index_cache`` last (the
indexer's key planes, `helios.ignition.token_indexer`) and writes this step's index keys there.

Mutation: k_cache and v_cache (this step's keys/values, through ``helios::cache_write``), the draft
planes and ``index_cache`` when present, and output_counts (one count per sampled row, ``index_put_`` with
accumulation) are written in place. Nothing else that is passed in is modified.
"""

from __future__ import annotations

import torch

import helios.abi.completion  # noqa: F401  (registers helios::completion_record)
import helios.abi.sampling  # noqa: F401  (registers helios::sample)
import helios.abi.token_logprobs  # noqa: F401  (registers helios::token_logprobs)
from helios.abi.sampling import split_sampling_parameters
from helios.ignition.architecture import Architecture
from helios.ignition.decoder import PackedStep, decoder_hidden, lm_logits, slot_mapping
from helios.ignition.draft import DraftStorage, split_weights, write_history
from helios.ignition.engram import engram_embedding
from helios.ignition.program_spec import (
    DRAFT_INPUTS, ENGRAM_PROJ, ENGRAM_ROWS, PENDING_TOKENS, ProgramOptions, engram_weight_slots, logprob_width,
    model_weight_layout,
)
from helios.ignition.sparse_latent import IndexStorage
from helios.ignition.speculative import with_emitted
from helios.ignition.token_indexer import INDEX_CACHE
from helios.ignition.tensor_parallel import sample_tokens, sampled_logits, token_scores, with_logit_bias
from helios.ignition.window_split import WINDOW_INPUTS, WindowStorage, window_tokens


class GenerationProgram(torch.nn.Module):
    """PREFILL and DECODE: run the packed tokens, sample one token per sampling row."""

    up_projects = True  # prompt rows: latent attention up-projects the context (see `PackedStep`)
    # Prompt rows sample from their last token only: the last layer's output projection and MLP
    # skip the others (`decoder_hidden`'s rows). A DECODE row is one token, so it has nothing to skip.
    last_rows_only = True

    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions = ProgramOptions()):
        super().__init__()
        self.arch = arch
        self.page_tokens = page_tokens
        self.draft = options.draft
        self.record_tokens = options.record_tokens
        self.token_logprobs = options.token_logprobs
        extra = options.multimodal.extra_weights if options.multimodal is not None else ()
        extra += engram_weight_slots(arch, options)
        self.weight_names = tuple(slot.name for slot in model_weight_layout(arch, options.draft, extra))
        self.engram = options.engram is not None
        # Inputs the forward takes as ``*trailing``: the draft's (GenerationProgram) or more; last, the
        # sliding layers' own region where the layers mix windows (`helios.ignition.window_split`).
        self.trailing_input_names = DRAFT_INPUTS if options.draft is not None else ()
        self.window_split = window_tokens(arch, options) > 0
        if self.window_split:
            self.trailing_input_names = (*self.trailing_input_names, *WINDOW_INPUTS)
        if self.engram:  # last of all: the staged n-gram rows (`helios.ignition.engram`)
            self.trailing_input_names = (*self.trailing_input_names, ENGRAM_ROWS)
        self.indexed = arch.indexer is not None
        if self.indexed:  # last: the token indexer's key planes (`helios.ignition.token_indexer`)
            self.trailing_input_names = (*self.trailing_input_names, INDEX_CACHE)

    def forward(
        self, weights: list[torch.Tensor], k_cache, v_cache, output_counts, prompt_counts, page_table,
        token_ids, positions, query_lens, request_slots, generations, sample_rows,
        seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values, submission, *draft,
    ):
        step = self.packed_step(token_ids, positions, query_lens, request_slots, page_table)
        return self.run(weights, k_cache, v_cache, (output_counts, prompt_counts), step,
                        (request_slots, generations, sample_rows, query_lens, submission),
                        (seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values), draft)

    def run(self, weights, k_cache, v_cache, counts, step: PackedStep, lanes, controls, draft=(), pending=None,
            extra=None):
        step, draft = self.with_index(step, draft)
        rows, draft = self.split_engram(draft)
        step, draft = self.with_window(step, lanes[0], draft)
        w = self.bind(weights, step, lanes[0], draft)
        step = self.with_engram(step, w, rows)
        hidden = self.last_hidden(w, k_cache, v_cache, step, extra)
        sampled, logits, scores = self.sample(w, hidden, step, counts, lanes, controls)
        if pending is not None:
            store_pending(pending, lanes[0], sampled)
        return self.completion(step, lanes, sampled), logits, *scores

    def last_hidden(self, w, k_cache, v_cache, step: PackedStep, extra) -> torch.Tensor:
        """Final-normed hidden states [R, H] of each row's last packed token (`last_tokens`), the
        one it samples from; `extra`: a subclass's own inputs. A prompt program (`last_rows_only`)
        leaves the other tokens out of the last layer past its attention."""
        last = self.last_tokens(step)
        if self.last_rows_only:
            return decoder_hidden(self.arch, w, k_cache, v_cache, step, last)
        return decoder_hidden(self.arch, w, k_cache, v_cache, step)[last]

    def split_engram(self, trailing) -> tuple[torch.Tensor | None, tuple]:
        """(the staged n-gram rows, the other trailing inputs); (None, trailing) without Engram."""
        if not self.engram:
            return None, tuple(trailing)
        return trailing[-1], tuple(trailing[:-1])

    def with_index(self, step: PackedStep, trailing) -> tuple[PackedStep, tuple]:
        """`step` with the indexer's storage (the last trailing input) and the rest of `trailing`;
        unchanged without an indexer."""
        if not self.indexed:
            return step, tuple(trailing)
        return step._replace(index=IndexStorage(trailing[-1], [])), tuple(trailing[:-1])

    @staticmethod
    def with_engram(step: PackedStep, w, rows) -> PackedStep:
        """`step` whose token embeddings gain the projected n-gram rows (unchanged without them)."""
        if rows is None:
            return step
        return step._replace(embedding_add=engram_embedding(w[ENGRAM_PROJ], rows))

    def with_window(self, step: PackedStep, request_slots, trailing) -> tuple[PackedStep, tuple]:
        """`step` with the window region's storage (the last three trailing inputs) and the rest of
        `trailing`; unchanged without a window split."""
        if not self.window_split:
            return step, trailing
        k_cache, v_cache, page_table = trailing[-3:]
        rows = page_table[request_slots.clamp(min=0)]
        slots = slot_mapping(step.query_start, rows, step.positions, self.page_tokens)
        return step._replace(window=WindowStorage(k_cache, v_cache, rows, slots)), tuple(trailing[:-3])

    def bind(self, weights: list[torch.Tensor], step: PackedStep, request_slots, draft) -> dict[str, torch.Tensor]:
        """The target's named weights, after the draft (if any) has written its history of `step`."""
        target, draft_weights = split_weights(self.weight_names, weights)
        if self.draft is not None:
            self.write_draft_history(draft_weights, step, request_slots, draft)
        return target

    def write_draft_history(self, weights, step: PackedStep, request_slots, draft) -> None:
        k_cache, v_cache, page_table = draft
        storage = DraftStorage(k_cache, v_cache, page_table[request_slots.clamp(min=0)])
        write_history(self.draft, weights, storage, step, self.page_tokens)

    def packed_step(self, token_ids, positions, query_lens, request_slots, page_table) -> PackedStep:
        zero = torch.zeros(1, dtype=torch.int32, device=query_lens.device)
        query_start = torch.cat((zero, torch.cumsum(query_lens, 0).to(torch.int32)))
        rows_page_table = page_table[request_slots.clamp(min=0)]
        slots = slot_mapping(query_start, rows_page_table, positions, self.page_tokens)
        return PackedStep(token_ids, positions, query_start, rows_page_table, slots, up_project=self.up_projects)

    def sample(self, w, hidden, step: PackedStep, counts, lanes, controls):
        """Sample each row's next token from `hidden`, the final-normed states [R, H] of the rows'
        last packed tokens; count it in output_counts.
        Returns (sampled, logits, scores): `logits` are the unbiased `sampled_logits` (this rank's
        vocabulary rows under tensor parallelism), `scores` is () or, in a token-logprobs program,
        the ``helios::token_logprobs`` outputs of the distribution the token was drawn from (read
        before this step's token is counted)."""
        output_counts, prompt_counts = counts
        request_slots, sample_rows = lanes[0], lanes[2]
        seeds, counters, params, grammar_mask, bias_ids, bias_values = controls
        head = w["embed"] if self.arch.tie_word_embeddings else w["lm_head"]
        logits = sampled_logits(self.arch, hidden, head, w.get("lm_head_bias"))
        slots, start = request_slots.clamp(min=0), w.get("vocab.start")
        biased = with_logit_bias(logits, bias_ids[slots], bias_values[slots], start)
        temperature, top_k, top_p, min_p, penalties = split_sampling_parameters(params)
        allow = torch.ones_like(sample_rows)  # unconstrained rows carry an all-ones mask
        row_counts = (prompt_counts[slots], output_counts[slots])
        sampled = sample_tokens(self.arch, biased, start, (seeds, counters, temperature, top_k, top_p, min_p),
                                penalties, row_counts, grammar_mask, allow)
        sampled = torch.where(sample_rows, sampled, torch.full_like(sampled, -1))
        scores = ()
        if self.token_logprobs:
            scores = token_scores(self.arch, biased, start, sampled, penalties, row_counts, grammar_mask, allow,
                                  logprob_width(self.arch))
        counted = (sampled >= 0).to(output_counts.dtype)  # NO_TOKEN (-1) rows count nothing
        output_counts.index_put_((slots, sampled.clamp(min=0)), counted, accumulate=True)
        return sampled, logits, tuple(scores)

    @staticmethod
    def last_tokens(step: PackedStep) -> torch.Tensor:
        return (step.query_start[1:] - 1).clamp(min=0).to(torch.int64)

    def completion(self, step: PackedStep, lanes, sampled) -> torch.Tensor:
        """The ABI completion record [R, fields] of this round (no drafts: accepted is 0)."""
        request_slots, generations, sample_rows, query_lens, submission = lanes
        offered = query_lens.to(torch.int64)
        consumed = torch.where(offered > 0, step.positions[self.last_tokens(step)] + 1, torch.zeros_like(offered))
        emitted = (sampled >= 0).to(torch.int64)
        record = torch.ops.helios.completion_record(
            request_slots, generations, submission.reshape(()), sampled, offered, torch.zeros_like(offered),
            emitted, consumed, None,
        )
        return with_emitted(record, sampled.unsqueeze(-1), self.record_tokens)


def store_pending(pending: torch.Tensor, request_slots: torch.Tensor, sampled: torch.Tensor) -> None:
    """pending[slot] = the row's sampled token, for rows that sampled one. Written as an
    accumulated difference so that padding rows (slot -1, clamped to 0) add nothing, whatever
    order duplicate indices are applied in."""
    slots = request_slots.clamp(min=0)
    change = torch.where(sampled >= 0, sampled - pending[slots], torch.zeros_like(sampled))
    pending.index_put_((slots,), change, accumulate=True)


def with_device_pending(token_ids: torch.Tensor, request_slots: torch.Tensor, pending: torch.Tensor) -> torch.Tensor:
    """DECODE tokens (one per row): the host's where >= 0, else the slot's device-owned pending token."""
    return torch.where(token_ids >= 0, token_ids, pending[request_slots.clamp(min=0)])


class DecodeProgram(GenerationProgram):
    """DECODE: one token per row; with `ProgramOptions.device_pending` it also takes
    ``pending_tokens`` (first of its trailing inputs), feeds it to rows packed as -1 and stores
    every sampled token there (see `helios.ignition.program_spec`)."""

    up_projects = False
    last_rows_only = False

    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions = ProgramOptions()):
        super().__init__(arch, page_tokens, options)
        self.device_pending = options.device_pending
        if self.device_pending:
            self.trailing_input_names = (PENDING_TOKENS, *self.trailing_input_names)

    def forward(
        self, weights: list[torch.Tensor], k_cache, v_cache, output_counts, prompt_counts, page_table,
        token_ids, positions, query_lens, request_slots, generations, sample_rows,
        seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values, submission, *trailing,
    ):
        step = self.packed_step(token_ids, positions, query_lens, request_slots, page_table)
        return self.decode(weights, k_cache, v_cache, (output_counts, prompt_counts), step,
                           (request_slots, generations, sample_rows, query_lens, submission),
                           (seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values), trailing)

    def decode(self, weights, k_cache, v_cache, counts, step: PackedStep, lanes, controls, trailing, extra=None):
        pending, draft = (trailing[0], trailing[1:]) if self.device_pending else (None, trailing)
        if pending is not None:
            step = step._replace(token_ids=with_device_pending(step.token_ids, lanes[0], pending))
        if extra is None:  # subclasses that override `run` (hybrid recurrent layers) take no extra inputs
            return self.run(weights, k_cache, v_cache, counts, step, lanes, controls, draft, pending)
        return self.run(weights, k_cache, v_cache, counts, step, lanes, controls, draft, pending, extra)


class TunedDecodeProgram(DecodeProgram):
    """DECODE of a tuned core: DecodeProgram plus the tuned split count of this variant."""

    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions, rows: int):
        super().__init__(arch, page_tokens, options)
        self.splits_index = options.attention_tuning.index(rows)

    def forward(
        self, weights: list[torch.Tensor], k_cache, v_cache, output_counts, prompt_counts, page_table,
        token_ids, positions, query_lens, request_slots, generations, sample_rows,
        seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values, submission, attention_splits, *trailing,
    ):
        step = self.packed_step(token_ids, positions, query_lens, request_slots, page_table)
        step = step._replace(splits=attention_splits[self.splits_index:self.splits_index + 1])
        return self.decode(weights, k_cache, v_cache, (output_counts, prompt_counts), step,
                           (request_slots, generations, sample_rows, query_lens, submission),
                           (seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values), trailing)


class MixedProgram(GenerationProgram):
    """MIXED: prompt rows and generating rows in one packed batch; pending tokens per row."""

    up_projects = False  # up to max-concurrency rows: gathering every row's context would not pay

    def forward(
        self, weights: list[torch.Tensor], k_cache, v_cache, output_counts, prompt_counts, page_table,
        token_ids, positions, query_lens, request_slots, generations, sample_rows,
        seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values, submission, pending_ids, *draft,
    ):
        step = self.packed_step(token_ids, positions, query_lens, request_slots, page_table)
        step = step._replace(token_ids=self.with_pending(step, pending_ids))
        return self.run(weights, k_cache, v_cache, (output_counts, prompt_counts), step,
                        (request_slots, generations, sample_rows, query_lens, submission),
                        (seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values), draft)

    @staticmethod
    def with_pending(step: PackedStep, pending_ids: torch.Tensor) -> torch.Tensor:
        """Packed tokens with each row's first token replaced by its pending token where >= 0."""
        num_tokens, num_rows = step.token_ids.shape[0], pending_ids.shape[0]
        index = torch.arange(num_tokens, device=step.token_ids.device, dtype=step.query_start.dtype)
        rows = torch.searchsorted(step.query_start[1:].contiguous(), index, right=True).clamp(max=num_rows - 1)
        is_first = index == step.query_start[rows]
        pending = pending_ids[rows]
        return torch.where(is_first & (pending >= 0), pending, step.token_ids)


class ScoredPrefillProgram(GenerationProgram):
    """SCORED_PREFILL: a prefill that also scores target_ids at every packed position. Only
    requests that ask for scores run it, so it always returns the sampled token's log-probabilities
    too (`LOGPROB_OUTPUTS`)."""

    def __init__(self, arch: Architecture, page_tokens: int, options: ProgramOptions = ProgramOptions()):
        super().__init__(arch, page_tokens, options)
        self.token_logprobs = True

    def forward(
        self, weights: list[torch.Tensor], k_cache, v_cache, output_counts, prompt_counts, page_table,
        token_ids, positions, query_lens, request_slots, generations, sample_rows,
        seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values, submission, target_ids, *draft,
    ):
        step = self.packed_step(token_ids, positions, query_lens, request_slots, page_table)
        step, draft = self.with_index(step, draft)
        rows, draft = self.split_engram(draft)
        step, draft = self.with_window(step, request_slots, draft)
        w = self.bind(weights, step, request_slots, draft)
        step = self.with_engram(step, w, rows)
        hidden = decoder_hidden(self.arch, w, k_cache, v_cache, step)  # every token: each is scored
        lanes = (request_slots, generations, sample_rows, query_lens, submission)
        sampled, logits, scores = self.sample(w, hidden[self.last_tokens(step)], step, (output_counts, prompt_counts), lanes,
                                              (seeds, counters, sampling_params, grammar_mask, logit_bias_ids, logit_bias_values))
        targets = self.target_logprobs(w, hidden, step, target_ids)
        return self.completion(step, lanes, sampled), logits, *scores, *targets

    def target_logprobs(self, w, hidden, step: PackedStep, target_ids) -> tuple[torch.Tensor, ...]:
        """(each packed token's target log-probability, its top ids, their log-probabilities)."""
        logprobs = torch.log_softmax(lm_logits(self.arch, w, hidden).to(torch.float32), dim=-1)
        scored = logprobs.gather(1, target_ids.clamp(min=0)[:, None]).squeeze(1)
        # Stable sort: probability descending, id ascending on ties (helios::token_logprobs' order).
        order = torch.sort(logprobs, dim=-1, descending=True, stable=True).indices[:, :logprob_width(self.arch)]
        return torch.where(step.slot_mapping >= 0, scored, torch.zeros_like(scored)), order, logprobs.gather(1, order)

