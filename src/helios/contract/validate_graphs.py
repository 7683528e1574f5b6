"""GraphContract rules that need only the serving contract: capacity variants and speculative
extents, bindings (validate_bindings.py), state accesses, pending-token ownership, cursors,
version gates, and the capacities the ServingContract selects from the graphs.
"""

from __future__ import annotations

from helios.contract import serving_pb2 as spb
from helios.contract.index import ContractIndex
from helios.contract.rules import CONTRACT, fail, graph_path, op_label, require
from helios.contract.validate_bindings import check_bindings, length_source

S = spb
CONSUMERS = frozenset({S.GRAPH_OPERATION_DECODE, S.GRAPH_OPERATION_SPECULATIVE, S.GRAPH_OPERATION_MIXED})
PRODUCERS = CONSUMERS | {
    S.GRAPH_OPERATION_INITIALIZATION,
    S.GRAPH_OPERATION_RESTORATION,
    S.GRAPH_OPERATION_PREFILL,
    S.GRAPH_OPERATION_SCORED_PREFILL,
    S.GRAPH_OPERATION_RESUME,
}
VERSION3_OPERATIONS = frozenset({S.GRAPH_OPERATION_SPECULATIVE, S.GRAPH_OPERATION_TUNING, S.GRAPH_OPERATION_VISION})
LOGPROB_OPERATIONS = frozenset({S.GRAPH_OPERATION_PREFILL, S.GRAPH_OPERATION_DECODE, S.GRAPH_OPERATION_MIXED,
                                S.GRAPH_OPERATION_SPECULATIVE})
MAX_TOKEN_LOGPROBS = 20  # alternatives a token-logprobs graph may return per row (OpenAI's bound)
WRITES = frozenset({S.ACCESS_MODE_WRITE, S.ACCESS_MODE_READ_WRITE})
READS = frozenset({S.ACCESS_MODE_READ, S.ACCESS_MODE_READ_WRITE})


def check_graphs(contract: spb.ServingContract, index: ContractIndex) -> None:
    model = contract.model
    for i, graph in enumerate(model.graphs):
        path = graph_path(i)
        if graph.operation in VERSION3_OPERATIONS or len(graph.tuned_bindings) > 0:
            field = "operation" if graph.operation in VERSION3_OPERATIONS else "tuned_bindings"
            require(model.version >= 3, f"{path}.{field}", "requires contract version 3")
        _check_variants(graph, path, model, contract.context_tokens)
        check_bindings(graph, path, model)
        _check_accesses(graph, path, index)
        _check_pending(graph, path, index)
        _check_extras(graph, path, index)
    _check_pending_producers(model)
    _check_selected_capacities(contract)


def _check_variants(graph: spb.GraphContract, path: str, model: spb.ModelContract, context: int) -> None:
    require(len(graph.variants) > 0, f"{path}.variants", "a graph declares at least one captured capacity variant")
    seen: dict[bytes, int] = {}
    patch_capacities = set(model.vision.patch_capacities)
    for j, variant in enumerate(graph.variants):
        item = f"{path}.variants[{j}]"
        b, w, p = variant.batch_capacity, variant.token_capacity, variant.packed_token_capacity
        require(b > 0, f"{item}.batch_capacity", "B must be nonzero")
        require(w > 0, f"{item}.token_capacity", "W must be nonzero")
        require(p >= b, f"{item}.packed_token_capacity", f"P={p} is below the {b} rows needed (one pending position per lane)")
        require(p <= b * w, f"{item}.packed_token_capacity", f"P={p} exceeds B x W = {b * w}")
        if graph.operation == S.GRAPH_OPERATION_SPECULATIVE:
            _check_speculative(graph, variant, item, context)
        else:
            for name in ("draft_tokens", "confidence_width", "lane_limit"):
                require(getattr(variant, name) == 0, f"{item}.{name}", "only SPECULATIVE graphs declare proposals")
        if graph.operation == S.GRAPH_OPERATION_VISION:
            require(variant.patch_capacity > 0, f"{item}.patch_capacity", "a VISION variant declares its patch capacity")
        if variant.patch_capacity:
            require(
                variant.patch_capacity in patch_capacities,
                f"{item}.patch_capacity",
                f"{variant.patch_capacity} is not a captured patch capacity of the vision contract",
            )
        key = variant.SerializeToString(deterministic=True)
        if key in seen:
            fail(item, f"duplicate capacity variant (same as variants[{seen[key]}])")
        seen[key] = j


def _check_speculative(graph: spb.GraphContract, variant: spb.GraphCapacity, path: str, context: int) -> None:
    d, w = variant.draft_tokens, variant.token_capacity
    if w == 1:
        require(d == 0, f"{path}.draft_tokens", "width-one speculative programs draw no proposals")
    ceiling = min(d + 1, w)
    require(variant.lane_limit > 0, f"{path}.lane_limit", "a speculative lane offers at least its pending token")
    require(
        variant.lane_limit <= ceiling,
        f"{path}.lane_limit",
        f"lane limit {variant.lane_limit} exceeds min(D + 1, W) = {ceiling}",
    )
    require(variant.lane_limit <= context, f"{path}.lane_limit", f"exceeds context_tokens ({context})")
    conf = variant.confidence_width
    require(conf == 0 or conf == d, f"{path}.confidence_width", f"confidence width {conf} differs from D = {d}")
    if length_source(graph) == S.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT and d > 0:
        require(
            conf == d,
            f"{path}.confidence_width",
            "SPECULATIVE_PREFIX_LIMIT programs allocate prefixes from confidence; declare confidence_width = D",
        )


def _check_accesses(graph: spb.GraphContract, path: str, index: ContractIndex) -> None:
    seen: set[str] = set()
    if graph.operation == S.GRAPH_OPERATION_VISION:
        require(graph.state_rows_per_request == 0, f"{path}.state_rows_per_request", "VISION graphs hold no request rows")
    if graph.operation == S.GRAPH_OPERATION_TUNING:
        require(len(graph.state_accesses) == 0, f"{path}.state_accesses", "tuning producers write only their catalog outputs")
        require(graph.state_rows_per_request == 0, f"{path}.state_rows_per_request", "tuning producers hold no request rows")
    for j, access in enumerate(graph.state_accesses):
        item = f"{path}.state_accesses[{j}].view"
        view = index.state_views.get(access.view)
        require(view is not None, item, f"unknown state view {access.view!r}")
        require(access.view not in seen, item, f"state view {access.view!r} is accessed twice")
        seen.add(access.view)
        if view.message.row_stride > 0:
            require(
                graph.state_rows_per_request > 0,
                f"{path}.state_rows_per_request",
                f"the graph accesses per-row state view {access.view!r}; declare the rows one request occupies",
            )


def _mode(graph: spb.GraphContract, view: str) -> int | None:
    for access in graph.state_accesses:
        if access.view == view:
            return access.mode
    return None


def _check_pending(graph: spb.GraphContract, path: str, index: ContractIndex) -> None:
    """A consumer's pending token is host-fed (a PENDING_TOKEN binding), device-owned (a readable
    `pending_token_view`), or both: then the graph feeds the host's token where the host packs one
    (>= 0) and the view's where it packs -1 (a second execution frame), and it must also write the
    view (it keeps the view current for the frame behind it)."""
    view = graph.pending_token_view
    host = [j for j, b in enumerate(graph.bindings) if b.source == S.VALUE_SOURCE_PENDING_TOKEN]
    if graph.operation not in CONSUMERS:
        require(view == "", f"{path}.pending_token_view", "only DECODE, SPECULATIVE and MIXED graphs consume a pending token")
        return
    if view == "":
        require(
            len(host) > 0,
            f"{path}.pending_token_view",
            f"a {op_label(graph.operation)} graph needs its pending token: name a readable state view or bind PENDING_TOKEN",
        )
        return
    require(view in index.state_views, f"{path}.pending_token_view", f"unknown state view {view!r}")
    require(
        _mode(graph, view) in READS,
        f"{path}.pending_token_view",
        f"device-owned pending token view {view!r} must be read by the graph (READ or READ_WRITE access)",
    )
    require(
        not host or _mode(graph, view) in WRITES,
        f"{path}.bindings[{host[0]}].source" if host else path,
        f"a graph that binds PENDING_TOKEN beside view {view!r} must also write the view (READ_WRITE access)",
    )


def _check_pending_producers(model: spb.ModelContract) -> None:
    """Every producer writes a purely device-owned pending token view (no consumer binds the host's)."""
    views = {g.pending_token_view for g in model.graphs if g.pending_token_view and not _binds_pending(g)}
    for i, graph in enumerate(model.graphs):
        if graph.operation not in PRODUCERS:
            continue
        for view in sorted(views):
            require(
                _mode(graph, view) in WRITES,
                f"{graph_path(i)}.state_accesses",
                f"{op_label(graph.operation)} produces the device-owned pending token; declare a write of view {view!r}",
            )


def _binds_pending(graph: spb.GraphContract) -> bool:
    return any(b.source == S.VALUE_SOURCE_PENDING_TOKEN for b in graph.bindings)


def _check_extras(graph: spb.GraphContract, path: str, index: ContractIndex) -> None:
    if graph.draft_cursor:
        require(graph.operation in CONSUMERS, f"{path}.draft_cursor", "only generation graphs report a draft cursor")
        require(graph.draft_cursor in index.cursors, f"{path}.draft_cursor", f"unknown completion cursor {graph.draft_cursor!r}")
    if graph.token_logprobs:
        require(graph.operation in LOGPROB_OPERATIONS, f"{path}.token_logprobs",
                "only PREFILL, DECODE, MIXED and SPECULATIVE graphs have token-logprobs variants")
        require(graph.token_logprobs <= MAX_TOKEN_LOGPROBS, f"{path}.token_logprobs",
                f"at most {MAX_TOKEN_LOGPROBS} alternatives per row")
    buffers: set[str] = set()
    for j, tuned in enumerate(graph.tuned_bindings):
        item = f"{path}.tuned_bindings[{j}]"
        require(graph.operation != S.GRAPH_OPERATION_TUNING, item, "tuning producers do not consume tuned bindings")
        require(tuned.buffer != "", f"{item}.buffer", "buffer name is empty")
        require(tuned.producer != "", f"{item}.producer", "producer name is empty")
        require(tuned.buffer not in buffers, f"{item}.buffer", f"buffer {tuned.buffer!r} is bound twice")
        buffers.add(tuned.buffer)
    deps: set[str] = set()
    for j, name in enumerate(graph.resource_dependencies):
        require(name not in deps, f"{path}.resource_dependencies[{j}]", f"duplicate dependency {name!r}")
        deps.add(name)


def _variants_of(model: spb.ModelContract, operation: int):
    return [v for g in model.graphs if g.operation == operation for v in g.variants]


def _check_selected_capacities(contract: spb.ServingContract) -> None:
    model = contract.model
    for op in (S.GRAPH_OPERATION_PREFILL, S.GRAPH_OPERATION_DECODE):
        require(bool(_variants_of(model, op)), f"{CONTRACT}.model.graphs", f"no {op_label(op)} graph is declared")
    decode_rows = max(v.batch_capacity for v in _variants_of(model, S.GRAPH_OPERATION_DECODE))
    require(
        contract.max_concurrency <= decode_rows,
        f"{CONTRACT}.max_concurrency",
        f"exceeds the captured DECODE rows ({decode_rows})",
    )
    prefill = max(v.packed_token_capacity for v in _variants_of(model, S.GRAPH_OPERATION_PREFILL))
    require(
        contract.prefill_tokens <= prefill,
        f"{CONTRACT}.prefill_tokens",
        f"exceeds the largest captured PREFILL variant ({prefill} tokens)",
    )
    widths = {v.token_capacity for v in _variants_of(model, S.GRAPH_OPERATION_SPECULATIVE)}
    for i, width in enumerate(contract.speculative_widths):
        require(width in widths, f"{CONTRACT}.speculative_widths[{i}]", f"no SPECULATIVE variant has W = {width}")
