"""One generic program per graph handle of a contract (`helios.ignition.contract_core`).

A `ContractProgram` is called as ``module(weights, *inputs)``: `weights` in the graph's
`resource_dependencies` order, `inputs` the buffers named by `ProgramLayout.inputs` (every
destination buffer of the graph's bindings, then the buffers of the state views it accesses, its
tuned buffers, the submission input, and ``image_features`` for graphs that bind feature indices).
It finds its values through the value sources of the graph's bindings, never by buffer name, and
keeps per-request state in the contract's state views (`StateColumns`): the pending token, the RNG
counter, the consumed-token endpoint (the first 4 bytes of ``request_counters``), the output-token
histogram and, optionally, the host-table sink. It computes the model of `contract_core.model`.

Mutation: state views the graph declares as written, and a TUNING graph's tuned buffer, in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import helios.abi.sampling  # noqa: F401  (registers helios::sample)
from helios.contract import serving_pb2 as spb
from helios.ignition.contract_core.model import EMBED, HEAD
from helios.ignition.contract_core.speculative import speculate

S = spb
TOP = 20  # alternatives of the log-probability outputs


@dataclass(frozen=True)
class StateColumns:
    """int32 columns of the per-request state buffer (`requests`) and the other state buffers."""

    requests: str
    pending: int
    rng: int
    consumed: int
    histograms: str
    sink: str | None  # host-table rows accumulate here (a [rows, width] state buffer), if declared
    step: str | None  # a global int64 step counter, if declared


@dataclass(frozen=True)
class ProgramLayout:
    """What one program takes and returns, resolved from its graph and handle."""

    operation: int
    weights: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    sources: dict  # ValueSource -> buffer name (the first binding of each source)
    state: StateColumns
    writes: frozenset[str]  # state buffers the graph writes
    record_columns: int
    token_columns: tuple[int, int]  # first int64 column, count of the emitted tokens
    draft_lag: int | None
    draft_tokens: int = 0
    verify_tokens: int = 1
    packed_tokens: int = 1
    tuned: str | None = None



_SIGNED_VIEWS = {torch.uint16: (torch.int16, 0xFFFF), torch.uint32: (torch.int32, 0xFFFFFFFF)}


def unsigned_rows(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`tensor[index]` as int64 for any integer dtype: CUDA kernels cannot index 16- and 32-bit
    unsigned tensors, so those are read through their signed view of the same width and masked
    back to their unsigned values (the same words)."""
    signed = _SIGNED_VIEWS.get(tensor.dtype)
    if signed is None:
        return tensor[index].to(torch.int64)
    view, mask = signed
    return tensor.view(view)[index].to(torch.int64) & mask

class ContractProgram(torch.nn.Module):
    def __init__(self, layout: ProgramLayout):
        super().__init__()
        self.layout = layout

    def forward(self, weights: list[torch.Tensor], *inputs):
        lay = self.layout
        x = dict(zip(lay.inputs, inputs))
        w = dict(zip(lay.weights, weights))
        op = lay.operation
        if op == S.GRAPH_OPERATION_INITIALIZATION:
            return self.initialize(x)
        if op == S.GRAPH_OPERATION_TUNING:
            x[lay.tuned].fill_(0).add_(self.value(x, S.VALUE_SOURCE_CONSTANT)[0].to(x[lay.tuned].dtype))
            return ()
        if op == S.GRAPH_OPERATION_VISION:
            return (self.encode(w, x),)
        if op == S.GRAPH_OPERATION_SPECULATIVE:
            return speculate(self, w, x)
        if op == S.GRAPH_OPERATION_DECODE:
            return self.decode(w, x)
        return self.prompt(w, x)

    # -- values and state ----------------------------------------------------------------------

    def value(self, x, source: int) -> torch.Tensor | None:
        name = self.layout.sources.get(source)
        return x[name] if name is not None else None

    def lanes(self, x):
        """(live mask [R], request slots [R] clamped, first state row [R] clamped)."""
        rows = self.value(x, S.VALUE_SOURCE_LIVE_STATE_ROWS).to(torch.int64)
        slots = self.value(x, S.VALUE_SOURCE_SLOT)
        slots = rows if slots is None else slots.to(torch.int64)  # INITIALIZATION binds no slots
        live = torch.arange(rows.shape[0], device=rows.device) < self.value(x, S.VALUE_SOURCE_LIVE_ROW_COUNT)[0]
        return live, slots.clamp(min=0), rows.clamp(min=0)

    def column(self, x, rows, column: int) -> torch.Tensor:
        return x[self.layout.state.requests][rows, column].to(torch.int64)

    def put(self, x, rows, column: int, new: torch.Tensor, where: torch.Tensor) -> None:
        """state[rows, column] = new where `where` (an accumulated difference: rows of padding lanes
        add nothing, whatever order duplicate indices apply in)."""
        state = x[self.layout.state.requests]
        if state.shape[0] == 0 or self.layout.state.requests not in self.layout.writes:
            return
        old = state[rows, column].to(torch.int64)
        change = torch.where(where, new - old, torch.zeros_like(old)).to(state.dtype)
        state.index_put_((rows, torch.full_like(rows, column)), change, accumulate=True)

    def initialize(self, x):
        live, _, rows = self.lanes(x)
        for name in sorted(self.layout.writes):
            buffer = x[name]
            hit = torch.zeros(buffer.shape[0], dtype=torch.int64, device=buffer.device)
            hit = hit.index_add(0, rows, live.to(torch.int64))
            keep = (hit == 0).to(buffer.dtype)
            buffer.mul_(keep.reshape(-1, *([1] * (buffer.dim() - 1))))
        return ()

    # -- the model -----------------------------------------------------------------------------

    @staticmethod
    def logits(w, tokens: torch.Tensor, hidden: torch.Tensor | None = None) -> torch.Tensor:
        embed = w[EMBED].to(torch.float32)
        vocab = embed.shape[0]
        inside = (tokens >= 0) & (tokens < vocab)
        h = embed[tokens.clamp(0, vocab - 1)] * inside.unsqueeze(-1).to(torch.float32)
        if hidden is not None:
            h = hidden
        return h @ w[HEAD].to(torch.float32).T

    def sample(self, x, logits, slots, rows, offset, mask: torch.Tensor | None, extra_counts=None):
        """``helios::sample`` of `logits` [R, V] with the lanes' parameters (counter + `offset`)."""
        params = self.value(x, S.VALUE_SOURCE_SAMPLING_PARAMETERS)[slots].to(torch.float32)
        seeds = self.value(x, S.VALUE_SOURCE_SEED_BITS)
        seeds = (seeds[slots, 0] if seeds.dim() > 1 else seeds[slots]).to(torch.int64)
        counters = self.column(x, rows, self.layout.state.rng) + offset
        prompt_counts = unsigned_rows(self.value(x, S.VALUE_SOURCE_PROMPT_HISTOGRAM), slots).to(torch.int32)
        output_counts = x[self.layout.state.histograms][rows].to(torch.int32)
        if extra_counts is not None:
            output_counts = output_counts + extra_counts
        vocab = logits.shape[1]
        bias_ids = self.value(x, S.VALUE_SOURCE_LOGIT_BIAS_IDS)
        if bias_ids is not None:  # per slot, written at admission; ids -1 pad
            ids = bias_ids[slots].to(torch.int64)
            values = self.value(x, S.VALUE_SOURCE_LOGIT_BIAS_VALUES)[slots].to(torch.float32)
            logits = logits.scatter_add(1, ids.clamp(min=0), torch.where(ids >= 0, values, torch.zeros_like(values)))
        if mask is None:
            words = -(-vocab // 32)
            mask = torch.full((logits.shape[0], words), -1, dtype=torch.int32, device=logits.device)
        mask = mask.view(torch.int32) if mask.dtype == torch.uint32 else mask.to(torch.int32)
        every = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device)
        return torch.ops.helios.sample(
            logits.contiguous(), seeds, counters, params[:, 0].contiguous(), params[:, 1].to(torch.int32),
            params[:, 2].contiguous(), params[:, 3].contiguous(), params[:, 4:7].contiguous(),
            prompt_counts, output_counts, mask.contiguous(), every)

    def count(self, x, rows, tokens, where) -> None:
        """One more output of each emitted token in the lanes' histograms."""
        name = self.layout.state.histograms
        if name in self.layout.writes:
            x[name].index_put_((rows, tokens.clamp(min=0)), where.to(x[name].dtype), accumulate=True)

    def record(self, x, slots_raw, tokens, offered, accepted, emitted, consumed):
        """int64 [R, record columns]: the ABI columns, then the emitted ids (-1 padded)."""
        first, count = self.layout.token_columns
        gens = self.value(x, S.VALUE_SOURCE_GENERATION).to(torch.int64)
        last = torch.where(emitted > 0, tokens.gather(1, (emitted - 1).clamp(min=0)[:, None])[:, 0],
                           torch.full_like(emitted, -1))
        if self.layout.draft_lag is None:
            cursor = torch.full_like(consumed, -1)
        else:
            cursor = (consumed - self.layout.draft_lag).clamp(min=0)
        submission = x[self.layout.sources["submission"]].reshape(1).to(torch.int64).expand_as(consumed)
        columns = [slots_raw.to(torch.int64), gens, submission, last, offered, accepted, emitted, consumed, cursor,
                   torch.full_like(consumed, -1)]
        width = max(first + count, self.layout.record_columns)
        record = torch.full((consumed.shape[0], width), -1, dtype=torch.int64, device=consumed.device)
        record[:, :10] = torch.stack(columns, dim=-1)
        index = torch.arange(count, device=consumed.device)
        emitted_ids = torch.full((consumed.shape[0], count), -1, dtype=torch.int64, device=consumed.device)
        emitted_ids[:, :tokens.shape[1]] = tokens[:, :count]
        record[:, first:first + count] = torch.where(index < emitted[:, None], emitted_ids, -1)
        return record

    # -- operations ----------------------------------------------------------------------------

    def encode(self, w, x):
        """VISION: each feature is the merged patches' pixels through the embedding."""
        patches = self.value(x, S.VALUE_SOURCE_IMAGE_TENSOR).to(torch.float32)
        embed = w[EMBED].to(torch.float32)
        unit = 4
        merged = patches.reshape(patches.shape[0] // unit, unit * patches.shape[1])
        width = min(merged.shape[1], embed.shape[0])
        return (merged[:, :width] @ embed[:width]).to(w[EMBED].dtype)

    def prompt(self, w, x):
        live, slots, rows = self.lanes(x)
        lengths = self.value(x, S.VALUE_SOURCE_QUERY_LENGTH).to(torch.int64) * live
        start = torch.cat((torch.zeros(1, dtype=torch.int64, device=lengths.device), torch.cumsum(lengths, 0)))
        last = (start[1:] - 1).clamp(min=0)
        tokens = self.value(x, S.VALUE_SOURCE_PROMPT_TOKENS).to(torch.int64)
        hidden = None
        features = self.value(x, S.VALUE_SOURCE_IMAGE_FEATURE_INDICES)
        if features is not None:  # a feature token's embedding is its image feature
            index = features.to(torch.int64)[last]
            table = x["image_features"].to(torch.float32)
            embed = w[EMBED].to(torch.float32)
            plain = embed[tokens[last].clamp(0, embed.shape[0] - 1)] * (tokens[last] < embed.shape[0]).unsqueeze(-1)
            hidden = torch.where((index >= 0).unsqueeze(-1), table[index.clamp(min=0)], plain)
        logits = self.logits(w, tokens[last], hidden)
        decisions = self.value(x, S.VALUE_SOURCE_SAMPLING_DECISION).to(torch.bool)[last] & live & (lengths > 0)
        sampled = self.sample(x, logits, slots, rows, 0, self.value(x, S.VALUE_SOURCE_GRAMMAR_MASK))
        sampled = torch.where(decisions, sampled, torch.full_like(sampled, -1))
        emitted = decisions.to(torch.int64)
        consumed = self.value(x, S.VALUE_SOURCE_CONSUMED_TOKEN_END).to(torch.int64)
        self.commit(x, rows, live, sampled, emitted, consumed)
        self.sink(x, rows, start, lengths)
        out = [self.record(x, self.value(x, S.VALUE_SOURCE_SLOT), sampled[:, None], lengths, torch.zeros_like(lengths),
                           emitted, torch.where(live, consumed, torch.zeros_like(consumed)))]
        if self.layout.operation == S.GRAPH_OPERATION_SCORED_PREFILL:
            out += self.scores(w, x, tokens, logits, sampled)
        return tuple(out)

    def commit(self, x, rows, live, sampled, emitted, consumed) -> None:
        """The lanes' new pending tokens, consumed endpoints, RNG counters and histograms."""
        state = self.layout.state
        self.put(x, rows, state.pending, sampled, live & (emitted > 0))
        self.put(x, rows, state.consumed, consumed, live)
        self.put(x, rows, state.rng, self.column(x, rows, state.rng) + emitted, live)
        self.count(x, rows, sampled, live & (emitted > 0))

    def sink(self, x, rows, start, lengths) -> None:
        """Host-table rows of the lanes' packed tokens, summed per lane into the sink view."""
        staged = self.value(x, S.VALUE_SOURCE_HOST_TABLE_ROWS)
        name = self.layout.state.sink
        if staged is None or name is None or name not in self.layout.writes:
            return
        flat = staged.reshape(staged.shape[0], -1).to(torch.float32)
        position = torch.arange(flat.shape[0], device=flat.device)
        lane = torch.searchsorted(start[1:].contiguous(), position, right=True).clamp(max=rows.shape[0] - 1)
        inside = position < start[-1]
        sums = torch.zeros(rows.shape[0], flat.shape[1], device=flat.device)
        sums = sums.index_add(0, lane, flat * inside.unsqueeze(-1))
        width = min(flat.shape[1], x[name].shape[1])
        target = x[name]
        update = torch.zeros(rows.shape[0], target.shape[1], device=flat.device)
        update[:, :width] = sums[:, :width] * (lengths > 0).unsqueeze(-1)
        target.index_put_((rows,), update.to(target.dtype), accumulate=True)

    def scores(self, w, x, tokens, last_logits, sampled):
        """SCORED_PREFILL: token log-probabilities of the sampled tokens, then each packed token's
        target log-probability and most probable next ids."""
        chosen = torch.log_softmax(last_logits, -1)
        top = chosen.topk(TOP, dim=-1)
        token_logprob = torch.where(sampled >= 0, chosen.gather(1, sampled.clamp(min=0)[:, None])[:, 0],
                                    torch.full_like(chosen[:, 0], float("-inf")))
        every = torch.log_softmax(self.logits(w, tokens), -1)
        targets = self.value(x, S.VALUE_SOURCE_SCORED_TARGET_TOKENS).to(torch.int64)
        target = every.gather(1, targets.clamp(min=0)[:, None])[:, 0]
        order = torch.sort(every, dim=-1, descending=True, stable=True).indices[:, :TOP]
        return [token_logprob, top.indices, top.values, target, order, every.gather(1, order)]

    def decode(self, w, x):
        live, slots, rows = self.lanes(x)
        state = self.layout.state
        tokens = self.column(x, rows, state.pending)
        host = self.value(x, S.VALUE_SOURCE_PENDING_TOKEN)
        if host is not None:  # a host-fed graph: the host's token where it sent one
            host = host.to(torch.int64)
            tokens = torch.where(host >= 0, host, tokens)
        logits = self.logits(w, tokens)
        decisions = self.value(x, S.VALUE_SOURCE_SAMPLING_DECISION)[:live.shape[0]].to(torch.bool) & live
        sampled = self.sample(x, logits, slots, rows, 0, self.value(x, S.VALUE_SOURCE_GRAMMAR_MASK))
        sampled = torch.where(decisions, sampled, torch.full_like(sampled, -1))
        emitted = decisions.to(torch.int64)
        consumed = self.column(x, rows, state.consumed) + live.to(torch.int64)
        self.commit(x, rows, live, sampled, emitted, consumed)
        if state.step is not None and state.step in self.layout.writes:
            x[state.step][:1].add_(1)
        ones = live.to(torch.int64)
        return (self.record(x, self.value(x, S.VALUE_SOURCE_SLOT), sampled[:, None], ones, torch.zeros_like(ones),
                            emitted, torch.where(live, consumed, torch.zeros_like(consumed))),)
