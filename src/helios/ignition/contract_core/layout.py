"""What each generated program takes and returns, resolved from a contract (`contract_core`).

`complete` adds to a copy of the manifest what only program generation knows: each handle's
``program_inputs`` / ``program_outputs``, the OUTPUT buffers of log-probabilities, scores and image
features, and the ``image_features`` buffer the runtime writes for prompt programs of a VISION core.
Contracts outside the generator's shape raise `ContractCoreError` naming the field.
"""

from __future__ import annotations

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.views import TARGET_LOGPROB_OUTPUTS, TOKEN_LOGPROB_OUTPUTS
from helios.errors import ContractError
from helios.ignition.contract_core.programs import TOP, ProgramLayout, StateColumns

S, M = spb, mpb
VISION_OUTPUT = "out.image_features"
FEATURE_BUFFER_INPUT = "image_features"  # the buffer the runtime writes a step's image features into
# State views the generated programs keep their per-request state in (names the example declares).
PENDING, RNG, COUNTERS, HISTOGRAMS, SINK, STEP = (
    "pending_token", "rng_counter", "request_counters", "histograms", "draft_hidden", "step_counter")


class ContractCoreError(ContractError):
    """The contract lacks something the generated programs need; `path` names it."""


def _require(condition: bool, path: str, reason: str) -> None:
    if not condition:
        raise ContractCoreError(path, reason)


def state_columns(contract: spb.ServingContract, manifest: mpb.ExecutionManifest) -> StateColumns:
    views = {v.name: v for v in contract.model.state_views}
    for name in (PENDING, RNG, COUNTERS, HISTOGRAMS):
        _require(name in views, "contract.model.state_views", f"the generated programs keep state in a {name!r} view")
    buffers = {b.name: b for b in manifest.buffers}
    requests = views[PENDING].buffer
    _require(buffers[requests].dtype == M.DTYPE_INT32, "contract.model.state_views",
             f"{PENDING!r} must live in an INT32 buffer")
    for name in (RNG, COUNTERS):
        _require(views[name].buffer == requests, "contract.model.state_views",
                 f"{name!r} must share {PENDING!r}'s buffer")
    sink = views[SINK].buffer if SINK in views else None
    step = views[STEP].buffer if STEP in views else None
    return StateColumns(requests, views[PENDING].byte_offset // 4, views[RNG].byte_offset // 4,
                        views[COUNTERS].byte_offset // 4, views[HISTOGRAMS].buffer, sink, step)


def complete(contract: spb.ServingContract, manifest: mpb.ExecutionManifest) -> dict[int, ProgramLayout]:
    """Fills `manifest` in place (module docstring); returns each handle's layout by handle index."""
    state = state_columns(contract, manifest)
    graphs = {g.name: g for g in contract.model.graphs}
    destinations = {d.name: d.buffer for d in manifest.destinations}
    views = {v.name: v.buffer for v in contract.model.state_views}
    buffers = {b.name: b for b in manifest.buffers}
    tokens = max(h.capacity.packed_token_capacity for h in manifest.graph_handles)
    rows = max(h.capacity.batch_capacity for h in manifest.graph_handles)
    hidden = buffers["w.embed"].shape[1].size if "w.embed" in buffers else 0
    _require(hidden > 0, "manifest.buffers", "the generated programs need a [vocabulary, hidden] 'w.embed' weight")
    if contract.model.graphs and any(g.operation == S.GRAPH_OPERATION_VISION for g in contract.model.graphs):
        _add(manifest, FEATURE_BUFFER_INPUT, buffers["w.embed"].dtype, (tokens, hidden), M.BUFFER_ROLE_INPUT)
        _add(manifest, VISION_OUTPUT, buffers["w.embed"].dtype, (tokens, hidden), M.BUFFER_ROLE_OUTPUT)
    if any(g.operation == S.GRAPH_OPERATION_SCORED_PREFILL for g in contract.model.graphs):
        for name, dtype, shape in _score_outputs(rows, tokens):
            _add(manifest, name, dtype, shape, M.BUFFER_ROLE_OUTPUT)
    completion = manifest.completion
    sampled = next(f for f in completion.fields if f.kind == M.COMPLETION_FIELD_KIND_SAMPLED_TOKENS)
    cursors = {c.name: c.lag_tokens for c in contract.model.cache.cursors}
    # Per-slot values written at admission by whichever graph admits (shared packing fills every
    # graph's PHYSICAL_REQUEST_ROW buffers then): a program may read another graph's.
    admission = {}
    for graph in contract.model.graphs:
        for binding in graph.bindings:
            if binding.indexing == S.INDEXING_PHYSICAL_REQUEST_ROW and binding.source != S.VALUE_SOURCE_PAGE_TABLE:
                admission.setdefault(binding.source, destinations[binding.destination])
    layouts = {}
    for i, handle in enumerate(manifest.graph_handles):
        graph = graphs[handle.graph]
        sources = {}
        inputs = []
        for binding in graph.bindings:
            buffer = destinations[binding.destination]
            sources.setdefault(binding.source, buffer)
            inputs.append(buffer)
        if graph.operation not in _AUXILIARY:
            for source, buffer in admission.items():
                if source not in sources:
                    sources[source] = buffer
                    inputs.append(buffer)
        inputs += [views[a.view] for a in graph.state_accesses]
        inputs += [t.buffer for t in graph.tuned_bindings]
        if graph.operation == S.GRAPH_OPERATION_TUNING:
            inputs += [o for entry in manifest.tuning_catalog if entry.graph == graph.name for o in entry.outputs]
        if completion.submission_input and graph.operation not in _AUXILIARY:
            inputs.append(completion.submission_input)
            sources["submission"] = completion.submission_input
        if S.VALUE_SOURCE_IMAGE_FEATURE_INDICES in sources:
            inputs.append(FEATURE_BUFFER_INPUT)
        inputs = list(dict.fromkeys(inputs))
        outputs = _outputs(graph, handle, completion)
        del handle.program_inputs[:], handle.program_outputs[:]
        handle.program_inputs.extend(inputs)
        handle.program_outputs.extend(outputs)
        writes = frozenset(views[a.view] for a in graph.state_accesses
                           if a.mode in (S.ACCESS_MODE_WRITE, S.ACCESS_MODE_READ_WRITE))
        tuned = inputs[-1] if graph.operation == S.GRAPH_OPERATION_TUNING else None
        speculative = graph.operation == S.GRAPH_OPERATION_SPECULATIVE
        lag = cursors.get(graph.draft_cursor) if speculative and graph.draft_cursor else None
        layouts[i] = ProgramLayout(
            graph.operation, tuple(graph.resource_dependencies), tuple(inputs), tuple(outputs), sources, state, writes,
            completion.record_bytes // 8, (sampled.byte_offset // 8, sampled.count), lag,
            handle.capacity.draft_tokens, handle.capacity.token_capacity, handle.capacity.packed_token_capacity, tuned)
    return layouts


_AUXILIARY = (S.GRAPH_OPERATION_INITIALIZATION, S.GRAPH_OPERATION_TUNING, S.GRAPH_OPERATION_VISION)


def _outputs(graph, handle, completion) -> list[str]:
    if graph.operation in (S.GRAPH_OPERATION_INITIALIZATION, S.GRAPH_OPERATION_TUNING):
        return []
    if graph.operation == S.GRAPH_OPERATION_VISION:
        return [VISION_OUTPUT]
    outputs = [completion.buffer]
    if graph.operation == S.GRAPH_OPERATION_SCORED_PREFILL:
        outputs += [*TOKEN_LOGPROB_OUTPUTS, *TARGET_LOGPROB_OUTPUTS]
    if graph.operation == S.GRAPH_OPERATION_SPECULATIVE and handle.capacity.confidence_width:
        outputs.append(completion.confidence_buffer)
    return outputs


def _score_outputs(rows: int, tokens: int):
    f32, i64 = M.DTYPE_FLOAT32, M.DTYPE_INT64
    return ((TOKEN_LOGPROB_OUTPUTS[0], f32, (rows,)), (TOKEN_LOGPROB_OUTPUTS[1], i64, (rows, TOP)),
            (TOKEN_LOGPROB_OUTPUTS[2], f32, (rows, TOP)), (TARGET_LOGPROB_OUTPUTS[0], f32, (tokens,)),
            (TARGET_LOGPROB_OUTPUTS[1], i64, (tokens, TOP)), (TARGET_LOGPROB_OUTPUTS[2], f32, (tokens, TOP)))


def _add(manifest: mpb.ExecutionManifest, name: str, dtype: int, shape, role: int) -> None:
    if any(b.name == name for b in manifest.buffers):
        return
    placement = M.PLACEMENT_DEVICE if role == M.BUFFER_ROLE_INPUT else M.PLACEMENT_MAPPED_HOST
    buffer = manifest.buffers.add(name=name, dtype=dtype, placement=placement, role=role)
    buffer.shape.extend(M.Dim(size=size) for size in shape)
