"""Shared packing: fills every value binding of a program from a `StepPlan`, generically.

Sources, types, extents and indexing are resolved once per program at startup (`PackingPlan`);
each step then writes only the values its rows need into the destination buffers, which the
executor passes to the program. Nothing here knows a model: a binding's `ValueSource` says where a
value comes from and its `Indexing` says where it goes.

Per-request values (prompt, `SamplingParams` with the seed, output limit, logit bias) come from
the requests' `RequestSpec`s, which the plans carry: `apply(plan)` (the executor calls it first
for every plan it launches) drops the plan's `finished` ids and records its `admitted` specs, so
every packer that applies the same plan stream - rank zero's and each tensor-parallel peer's -
holds the same records. `register`/`forget` do the same for one request (tests, tools).
SPECULATIVE lanes bind their ceiling (QUERY_LENGTH or SPECULATIVE_PREFIX_LIMIT: the row's reserved
query length) and the copied-token sources. With history drafting enabled (a startup option) the
packer keeps each request's history - its prompt plus every emission the executor validated
(`observe`) - and copies candidates from it (`helios.runtime.execution.history_drafting`) for lanes whose
history ends exactly at their pending token; otherwise every lane gets zero candidates.
PHYSICAL_REQUEST_ROW bindings are written when a row `admits` a new slot generation (which
invalidates everything remembered for the slot), whichever graph's step admits it, and page tables receive only the entries new
since the last upload. The per-slot state views any program holding request lanes writes are zeroed in an admitted
slot's rows (`reset_admitted`, which the executor calls before the plan's restores), unless the core has an
INITIALIZATION graph: the executor then runs it over the admitted rows instead. A
request with a penalty that is admitted again with outputs (readmitted after preemption) gets its
slot's output counts (the ``output_counts`` state view) rebuilt from the emissions the packer
observed for it, so its penalties count every output token, as had it never left its slot. SNAPSHOT
and RESTORATION graphs hold no request lane: `pack_state_copies` fills them from state-copy rows
(`helios.runtime.execution.state_programs`). Which
sources and indexings are supplied is `helios.contract.servable.SOURCES`, the table validation
checks too: a binding it refuses fails startup here (`UnsupportedBindingError`).

Host staging: on a device other than the CPU, every buffer that is rewritten each step (packed
tokens, per-row values, counts, grammar masks, the submission id) is packed into a pinned host
mirror and uploaded asynchronously at the end of `pack`, ordered before the program on the current
stream: in a device model's step arena (`helios.runtime.loading.step_arena`) one copy per run of
neighbouring buffers the step wrote (usually one a step), else one per buffer; a grammar mask is uploaded only while some row is constrained (and once more to
clear it). Per-slot admission values (a slot is admitted or gains pages) are asynchronous copies too:
page-table entries (an admitted row whole) from pinned staging, EOS ids, per-slot sampling values
and logit bias from pinned rows (`helios.runtime.execution.pinned_rows`; a bias row that already
holds padding is left alone), the prompt histogram counted on the host, only for a request with a
penalty (`helios.runtime.execution.prompt_histogram`): nothing before the program synchronises. There are two
sets of mirrors, one per execution frame (`plan.frame`): a plan's mirrors are rewritten only after
the previous plan of its frame finished, while the other frame's uploads may still be queued.

Values a step need not rewrite (slots, generations, sampling parameters... of the same rows as the
last write, an unconstrained grammar mask) are skipped on host buffers
(`helios.runtime.execution.kept_values`).

Bindings are resolved at startup by `helios.runtime.execution.bindings`; per-row, packed and
admission values come from `helios.runtime.execution.row_sources`.

Thread ownership: one packer per model worker; not thread-safe.
"""

from __future__ import annotations

from functools import cached_property
from operator import attrgetter
from typing import Mapping, Sequence

import torch

from helios.contract import PreparedContract
from helios.contract import serving_pb2 as spb
from helios.runtime.execution.bindings import (Binding, UnsupportedBindingError, admission_elsewhere,
                                               resolve_bindings, written_state)
from helios.runtime.execution.history_drafting import HistoryIndex
from helios.runtime.execution.host_staging import HostStaging
from helios.runtime.execution.image_packing import IMAGE_SOURCES, fill_image
from helios.runtime.execution.kept_values import KeptValues, rows_key_of
from helios.runtime.execution.masks import allowed_row, write_masks
from helios.runtime.execution.pack_staging import Staging as _Staging
from helios.runtime.execution.pack_values import eos_row, fill_copied, fill_state_copy, is_prompt_row, write_vector
from helios.runtime.execution.packed_tokens import write_packed
from helios.runtime.execution.row_sources import (ROW_COLUMNS, ROW_SOURCES, fill_admission, fill_page_tables,
                                                  packed_values)
from helios.runtime.records.plan import PlanRow, RowResult, StepPlan
from helios.runtime.records.request import RequestSpec

S = spb
_REQUEST_ID, _CONSTRAINED = attrgetter("request_id"), attrgetter("constrained")

_PACKED_SOURCES = {S.VALUE_SOURCE_PROMPT_TOKENS, S.VALUE_SOURCE_PROMPT_POSITIONS, S.VALUE_SOURCE_SCORED_TARGET_TOKENS}
_ADMISSION_SOURCES = {S.VALUE_SOURCE_PAGE_TABLE, S.VALUE_SOURCE_PROMPT_HISTOGRAM} | {
    S.VALUE_SOURCE_SEED_BITS, S.VALUE_SOURCE_SAMPLING_PARAMETERS, S.VALUE_SOURCE_OUTPUT_LIMIT
}
_ROW_INDEXING = {S.INDEXING_SUBMISSION_ROW, S.INDEXING_ACTIVE_ROW}
# The operations whose graphs hold request lanes (SNAPSHOT and RESTORATION copy rows, INITIALIZATION
# stands in for the reset, VISION and TUNING hold no request rows).
_LANE_OPERATIONS = (S.GRAPH_OPERATION_PREFILL, S.GRAPH_OPERATION_MIXED, S.GRAPH_OPERATION_DECODE,
                    S.GRAPH_OPERATION_SPECULATIVE, S.GRAPH_OPERATION_SCORED_PREFILL, S.GRAPH_OPERATION_RESUME)
_COPIED_SOURCES = {
    S.VALUE_SOURCE_COPIED_CANDIDATE_IDS, S.VALUE_SOURCE_COPIED_CANDIDATE_COUNT, S.VALUE_SOURCE_COPIED_CONSUMED_ENDPOINT,
    S.VALUE_SOURCE_COPIED_GENERATION, S.VALUE_SOURCE_COPIED_GRAMMAR_MASKS,
}


class Packer:
    """Writes a plan's values into the model's destination buffers (see the module docstring)."""

    def __init__(self, prepared: PreparedContract, buffers: Mapping[str, torch.Tensor], state_rows: int = 1,
                 history_drafting: bool = False, staged: bool | None = None, host_staging: HostStaging | None = None):
        """`host_staging`: the core's host tables (`helios.runtime.execution.host_staging`), None without any."""
        self._buffers = buffers
        self.host_staging = host_staging
        # Each request's tokens (prompt, then validated emissions): host tables hash n-grams of them.
        self._contexts: dict[str, list[int]] | None = {} if host_staging is not None else None
        self._state_rows = state_rows
        self._submission = prepared.manifest.completion.submission_input  # "" for a core without one
        self._staging = _Staging(prepared, buffers, staged, self._submission)
        self._requests: dict[str, RequestSpec] = {}
        self._num_logprob_requests = 0  # recorded requests that ask for log-probabilities
        self._num_drawing_requests = 0  # recorded requests that are not greedy (temperature > 0)
        self._bindings = {name: resolve_bindings(prepared, name) for name in prepared.graphs}
        if host_staging is None and any(b.source == S.VALUE_SOURCE_HOST_TABLE_ROWS
                                        for items in self._bindings.values() for b in items):
            raise UnsupportedBindingError("the core binds host-table rows but no host staging was given")
        self._elsewhere = {name: admission_elsewhere(self._bindings, name) for name in self._bindings}
        self._written_state = {name: written_state(prepared, name) for name in prepared.graphs}
        # The state views each graph writes, with their byte geometry (`_reset_state` zeroes them).
        writes = {S.ACCESS_MODE_WRITE, S.ACCESS_MODE_READ_WRITE}
        self._written_views = {name: tuple(a for a in graph.accesses if a.mode in writes)
                               for name, graph in prepared.graphs.items()}
        # Every per-slot view a graph holding request lanes writes: an admitted slot starts from zeros
        # in all of them, not only in those its admitting graph writes (`reset_admitted`).
        lanes = {graph.name for operation in _LANE_OPERATIONS for graph in prepared.graphs_for(operation)}
        self._slot_views = tuple({access.view: access for name in sorted(lanes)
                                  for access in self._written_views[name] if access.row_stride}.values())
        # A core with an INITIALIZATION graph initializes admitted slots itself (the executor runs it).
        self._initializes = bool(prepared.graphs_for(S.GRAPH_OPERATION_INITIALIZATION))
        self._histories: dict[str, HistoryIndex] | None = {} if history_drafting else None
        # Validated emissions of requests with a penalty (`observe`): a slot that admits one of them
        # again (after preemption) gets its output counts back from them (`_restore_output_counts`).
        self._outputs: dict[str, list[int]] = {}
        self._model_contract = prepared.contract.model
        self._unindexed: set[str] = set()  # registered requests whose history index is not built yet
        self._allowed = allowed_row(prepared.contract.model.vocabulary)
        self._kept = KeptValues(buffers, (name for names in self._written_state.values() for name in names))

    def enable_history_drafting(self) -> None:
        """Keep request histories from now on (call before the first request is registered)."""
        if self._requests:
            raise ValueError("history drafting must be enabled before requests are registered")
        if self._histories is None:
            self._histories = {}

    def apply(self, plan: StepPlan) -> None:
        """Drops `plan.finished` requests, then records `plan.admitted` ones (in that order: an id
        may be finished and admitted again)."""
        for request_id in plan.finished:
            self.forget(request_id)
        for spec in plan.admitted:
            self.register(spec)

    def register(self, spec: RequestSpec) -> None:
        self.forget(spec.request_id)  # an id registered again replaces its record
        self._requests[spec.request_id] = spec
        self._num_logprob_requests += spec.top_logprobs is not None
        self._num_drawing_requests += not spec.sampling.is_greedy
        if spec.sampling.penalised:
            self._outputs[spec.request_id] = []
        self._kept.clear()  # values kept for an id registered again may be the old spec's
        if self._contexts is not None:
            self._contexts[spec.request_id] = list(spec.prompt_ids)
        if self._histories is not None:  # indexed after the launch (`index_histories`), or when first read
            self._histories.pop(spec.request_id, None)
            self._unindexed.add(spec.request_id)

    def index_histories(self) -> None:
        """Builds the history indexes of the requests registered since the last call (milliseconds
        for a long prompt): the executor calls it once a plan's program is launched, so the
        index is built while the device runs instead of before the program."""
        for request_id in self._unindexed:
            self._histories[request_id] = HistoryIndex(self._requests[request_id].prompt_ids)
        self._unindexed.clear()

    def _history(self, request_id: str) -> HistoryIndex | None:
        if self._histories is None:
            return None
        if request_id in self._unindexed:
            self._unindexed.discard(request_id)
            self._histories[request_id] = HistoryIndex(self._requests[request_id].prompt_ids)
        return self._histories.get(request_id)

    def forget(self, request_id: str) -> None:
        """Drops a request's record (an id it never saw is ignored)."""
        spec = self._requests.pop(request_id, None)
        self._num_logprob_requests -= spec is not None and spec.top_logprobs is not None
        self._num_drawing_requests -= spec is not None and not spec.sampling.is_greedy
        if self._contexts is not None:
            self._contexts.pop(request_id, None)
        if self._histories is not None:
            self._histories.pop(request_id, None)
            self._unindexed.discard(request_id)
        self._outputs.pop(request_id, None)

    @property
    def num_requests(self) -> int:
        """Requests recorded (admitted by a plan and not finished since)."""
        return len(self._requests)

    def spec(self, request_id: str) -> RequestSpec | None:
        return self._requests.get(request_id)

    def observe(self, plan: StepPlan, results: Sequence[RowResult]) -> None:
        """Validated emissions of `plan`, in row order: they extend the requests' histories (and the
        outputs kept for requests with a penalty)."""
        if self._outputs:  # only while a request with a penalty is registered
            for row, result in zip(plan.rows, results):
                outputs = self._outputs.get(row.request_id)
                if outputs is not None:
                    outputs.extend(result.token_ids)
        if self._contexts is not None:
            for row, result in zip(plan.rows, results):
                context = self._contexts.get(row.request_id)
                if context is not None and result.token_ids:
                    context.extend(result.token_ids)
        if self._histories is None:
            return
        for row, result in zip(plan.rows, results):
            history = self._history(row.request_id) if result.token_ids else None
            if history is not None:
                history.extend(result.token_ids)

    def pack(self, graph: str, plan: StepPlan, submission: int | None = None) -> None:
        """Fills every binding of `graph` for `plan` (`apply` it first); `plan.masks` holds its
        constrained rows' grammar masks. `submission`: the id the core's submission input gets
        (staged with the step's values on a device; None leaves it)."""
        requests = list(map(self._requests.__getitem__, map(_REQUEST_ID, plan.rows)))
        self._staging.begin(plan.frame, plan.sequence)
        # Rows with per-slot values to write (admitted, or gaining pages): none in most decode steps.
        touched = [(row, req) for row, req in zip(plan.rows, requests)
                   if row.admits or row.new_page_ids or row.new_window_ids]
        admitting = [(row, req) for row, req in touched if row.admits]
        for row, _ in admitting:  # (their state was reset or initialized before the plan's restores)
            self._restore_output_counts(row)
        for binding in self._elsewhere[graph]:  # another graph's per-slot values, fixed at admission
            for row, req in admitting:
                self._kept.forget(binding.buffer_name)
                fill_admission(binding, self._buffers[binding.buffer_name], row, req, self._staging)
        try:
            self._fill_bindings(graph, plan, requests, touched)
        except BaseException:  # a binding recorded as kept may not have been written (or uploaded)
            self._kept.clear()
            raise
        if submission is not None and self._submission:
            self._staging.write_value(self._submission, submission)
        self._staging.upload()

    def _fill_bindings(self, graph: str, plan: StepPlan, requests: list, touched: list) -> None:
        """Writes `graph`'s bindings for `plan`, except those whose buffer already holds their values
        (`helios.runtime.execution.kept_values`: for a staged buffer, what its last upload left on
        the device, which a skipped binding then neither writes into this frame's mirror nor uploads).
        `touched`: the (row, request) pairs that admit a slot or gain pages."""
        copied = self._copied_for(graph, plan.rows)
        constrained = any(map(_CONSTRAINED, plan.rows))
        rows_key = self._kept.interned(rows_key_of(plan.rows))
        for binding in self._bindings[graph]:
            if binding.source == S.VALUE_SOURCE_GRAMMAR_MASK and not self._staging.mask_needed(binding, constrained):
                continue
            name = binding.buffer_name
            if self._staging.stages(name) and binding.indexing != S.INDEXING_SUBMISSION_ROW:
                self._kept.forget(name)  # a mirror's rows past the live ones differ by frame: kept only if padded
            elif self._kept.holds(binding, self._buffers[name], rows_key, constrained):
                continue
            target = self._staging.target(binding.buffer_name)
            if binding.source == S.VALUE_SOURCE_HOST_TABLE_ROWS:
                self._stage_rows(binding, plan)
            elif binding.source in IMAGE_SOURCES:
                fill_image(binding, target, plan.rows, self.images_of(plan.rows))
            elif binding.source in _COPIED_SOURCES:
                fill_copied(binding, target, plan.rows, copied, (plan.masks, self._allowed))
            else:
                self._fill(binding, target, plan.rows, requests, plan.masks, touched)

    def pack_state_copies(self, graph: str, plan: StepPlan, rows: Sequence) -> None:
        """Fills the bindings of a SNAPSHOT or RESTORATION `graph` for state-copy `rows` of `plan`
        (`helios.runtime.execution.state_programs.StateCopyRow`s: slot, generation, state row,
        snapshot row; only the sources `servable.STATE_COPY_SOURCES` names reach such a graph)."""
        self._staging.begin(plan.frame, plan.sequence)
        for binding in self._bindings[graph]:
            self._kept.forget(binding.buffer_name)
            fill_state_copy(binding, self._staging.target(binding.buffer_name), rows)
        self._staging.upload()

    def retire(self, sequence: int) -> None:
        """Submission `sequence` has finished on this rank: its host staging frames may be reused
        once every rank says so (`helios.runtime.execution.host_staging`)."""
        if self.host_staging is not None:
            self.host_staging.retire(sequence)

    def _stage_rows(self, binding: Binding, plan: StepPlan) -> None:
        """Host-table rows of every packed token, gathered into the plan's host frame and copied
        into the destination (asynchronously on a device, ordered before the program)."""
        lanes = []
        reach = self.host_staging.tables[binding.host_table].ngram_tokens - 1  # predecessors an n-gram reads
        for row in plan.rows:
            if row.pending_on_device:
                raise ValueError(f"{binding.destination}: a lane's pending token is on the device; "
                                 "host-table rows need host-known tokens")
            first = max(0, row.start_pos - reach)  # only the window the n-grams reach is copied
            window = self._contexts[row.request_id][first:row.start_pos] + list(row.token_ids)
            lanes.append((window, row.start_pos - first, len(row.token_ids)))
        frame = self.host_staging.stage(binding.host_table, plan.frame, plan.sequence, lanes)
        target = self._buffers[binding.buffer_name]
        target.copy_(frame[: target.shape[0]], non_blocking=target.device.type == "cuda" and frame.is_pinned())

    def top_logprobs(self, request_id: str) -> int | None:
        """The alternatives per token a registered request asks for (None: no log-probabilities)."""
        spec = self._requests.get(request_id)
        return spec.top_logprobs if spec is not None else None

    def wants_logprobs(self, plan: StepPlan) -> bool:
        """Whether a sampling row of `plan` belongs to a request that asks for log-probabilities."""
        if not self._num_logprob_requests:  # the usual step: no row need be looked at
            return False
        return any(row.samples and self._requests[row.request_id].top_logprobs is not None for row in plan.rows)
    def images_of(self, rows: Sequence[PlanRow]) -> list:
        """Each row's request images (`RequestImages`), None for a request without images."""
        return [self._requests[row.request_id].images for row in rows]

    def all_greedy(self, plan: StepPlan) -> bool:
        """Whether every row of `plan` belongs to a greedy request (`SamplingParams.is_greedy`)."""
        if not self._num_drawing_requests:  # the usual step: no row need be looked at
            return True
        return all(self._requests[row.request_id].sampling.is_greedy for row in plan.rows)

    def candidates(self, row: PlanRow, limit: int) -> tuple[int, ...]:
        """Copied history candidates for a lane: none unless its history ends at its pending token."""
        history = self._history(row.request_id)
        if history is None or len(history) != row.start_pos + 1 or not row.token_ids:
            return ()
        if history.tokens[-1] != row.token_ids[0]:
            return ()
        return history.candidates(min(limit, row.token_ceiling - 1))

    def _copied_for(self, graph: str, rows: Sequence[PlanRow]) -> list[tuple[int, ...]]:
        """Each row's candidates, at most the width of the graph's candidate-id buffer. A graph that
        binds per-position grammar masks gets no candidates for constrained lanes: the host grammar
        is not advanced along copied tokens, so only the lane's own (first) mask is known."""
        ids = next((b for b in self._bindings[graph] if b.source == S.VALUE_SOURCE_COPIED_CANDIDATE_IDS), None)
        if ids is None:
            return []
        masked = any(b.source == S.VALUE_SOURCE_COPIED_GRAMMAR_MASKS for b in self._bindings[graph])
        width = self._buffers[ids.buffer_name].shape[1]
        return [() if masked and row.constrained else self.candidates(row, width) for row in rows]


    def _restore_output_counts(self, row: PlanRow) -> None:
        """A slot admitting a request that already has outputs (readmitted after preemption: its
        state was zeroed, or recomputed by an INITIALIZATION program packed before this) counts
        them again, so its penalties see them."""
        outputs = self._outputs.get(row.request_id)
        if outputs and self._output_counts is not None:
            self._kept.forget(self._output_counts)
            # The slot's first state row: the row LIVE_STATE_ROWS names (`_fill`) and its reset cleared
            # (`_reset_state`); output_counts[slot], as the programs read it, with one state row a request.
            target = self._buffers[self._output_counts][row.slot * self._state_rows]
            self._staging.write_counts(self._output_counts, target, outputs)

    @cached_property
    def _output_counts(self) -> str | None:
        """The buffer of the contract's ``output_counts`` state view (one int32 row of counts per state
        row, a slot's in its first: ``output_counts[slot * state_rows, token]``), or None when the core
        keeps its counts otherwise."""
        view = next((v for v in self._model_contract.state_views if v.name == "output_counts"), None)
        if view is None or view.buffer not in self._buffers or view.byte_offset:
            return None
        buffer = self._buffers[view.buffer]
        if buffer.dim() != 2 or buffer.dtype != torch.int32 or view.row_stride != buffer.shape[1] * 4:
            return None
        return view.buffer

    def reset_admitted(self, graph: str, plan: StepPlan) -> None:
        """Zeroes, in every slot `plan` admits, the state views `graph` (the admitting graph) writes
        and those any other graph holding request lanes writes (`_reset_state`), unless the core has
        an INITIALIZATION graph (the executor runs it instead). The reset stands in for that
        initialization: a view the admitting graph leaves alone is still the new request's, and the
        first graph to read it (a DECODE that counts into a view PREFILL does not touch) must not
        find the previous owner's bytes. Not part of `pack`: the
        executor calls it where it would initialize the rows, before the plan's copies into slot
        state rows (a restore, which a reset after it would clear) and after those before them (a
        final snapshot of the slot's previous owner)."""
        if self._initializes:
            return
        views = self._slot_views + tuple(v for v in self._written_views[graph] if v not in self._slot_views)
        for row in plan.rows:
            if row.admits:
                self._reset_state(views, row.slot)

    def _reset_state(self, views, slot: int) -> None:
        """Zeroes the bytes of each of the state `views` (`AccessView`s) in the slot's state rows: a view is
        bytes [byte_offset, byte_offset + byte_extent) of each row (a buffer's rows are its first
        dimension, `row_stride` bytes apart), so views sharing a buffer keep each other's bytes. A
        whole-buffer view (no row stride: a global counter, say) belongs to no slot and is kept."""
        first = slot * self._state_rows
        for view in views:
            self._kept.forget(view.buffer)
            if not view.row_stride:
                continue
            rows = self._buffers[view.buffer][first:first + self._state_rows]
            row_bytes = rows.view(rows.shape[0], -1).view(torch.uint8)
            row_bytes[:, view.byte_offset:view.byte_offset + view.byte_extent].zero_()

    def _fill(self, binding, target, rows: Sequence[PlanRow], requests, masks, touched) -> None:
        """`touched`: the (row, request) pairs that admit a slot or gain pages (nothing to write
        for any other row of a PHYSICAL_REQUEST_ROW binding)."""
        source, indexing = binding.source, binding.indexing
        if indexing == S.INDEXING_PHYSICAL_REQUEST_ROW:
            if source == S.VALUE_SOURCE_PAGE_TABLE:
                fill_page_tables(binding, target, touched, self._staging)
            else:  # every other per-slot value is written only when a row admits its slot
                for row, req in touched:
                    if row.admits:
                        fill_admission(binding, target, row, req, self._staging)
        elif source == S.VALUE_SOURCE_INACTIVE_PADDING:
            target.fill_(binding.padding)
        elif indexing == S.INDEXING_PACKED_TOKEN:
            if not write_packed(target, source, rows, binding):  # tokens, positions, flags: row by row
                values = [v for row, req in zip(rows, requests) for v in packed_values(source, row, req)]
                write_vector(target, values, binding, pad=True)
        elif source == S.VALUE_SOURCE_GRAMMAR_MASK:
            write_masks(target, rows, masks, pad=indexing == S.INDEXING_SUBMISSION_ROW, allowed=self._allowed)
        elif indexing in _ROW_INDEXING:
            if source == S.VALUE_SOURCE_CONSTANT:
                values = [binding.constant] * len(rows)
            elif source == S.VALUE_SOURCE_LIVE_STATE_ROWS:  # a slot's first state row
                values = [row.slot * self._state_rows for row in rows]
            elif source == S.VALUE_SOURCE_EOS_IDS:
                values = [eos_row(req, target, binding) for req in requests]
            elif source in ROW_COLUMNS:
                values = ROW_COLUMNS[source](rows)
            else:
                value_of = ROW_SOURCES[source]
                values = [value_of(row, req) for row, req in zip(rows, requests)]
            write_vector(target, values, binding, pad=indexing == S.INDEXING_SUBMISSION_ROW)
        elif source == S.VALUE_SOURCE_LIVE_ROW_COUNT:
            target.fill_(len(rows) + binding.offset)
        elif source == S.VALUE_SOURCE_MIXED_PREFILL_ROW:
            index = next((i for i, row in enumerate(rows) if is_prompt_row(row)), None)
            target.fill_(binding.padding if index is None else index + binding.offset)
        else:  # CONSTANT (scalar)
            target.fill_(binding.constant)
