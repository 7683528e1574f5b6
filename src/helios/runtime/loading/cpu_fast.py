"""The fast graph of a CPU program: what its calls after the first one run (`CpuProgram`).

`fast_graph(graph)` derives it from a program graph whose ABI calls are bound to their registered
Python bodies (`helios.runtime.loading.cpu_programs.bind_abi_kernels`, which tags each such node
with its op in ``node.meta[OP_META]``). The first call of a `CpuProgram` runs that graph, whose
bodies check every argument; a later call with the same tensors runs the fast graph, whose shapes,
dtypes and devices are then the ones already checked. Each rewrite is exact (the same kernels on
the same values, `helios.abi.cpu_bodies`):

- `plan_steps`: every attention call of a step shares one `plan_attention` node (page ids, masks)
  when it reads the same page table, row bounds, positions, window (and chunk, for
  ``helios::paged_attention_chunked``) from planes of one cache buffer; every rotary/cache write shares one slot plan per slot mapping and one rotary plan per
  (cos, sin, slots). A plan node is inserted before the first call that uses it.
- `sample_selected_rows`: a sample call whose tokens are only ever selected by one bool tensor
  (``where(rows, tokens, other)``; ``full_like(tokens, ...)`` reads only its shape) computes only
  those rows (`helios.abi.cpu_bodies.sample_rows`); where its two count tables are row gathers
  (``table[slots]``) read by nothing else, it takes the tables and slots and gathers only when a
  row is penalised or draws (`helios.abi.cpu_bodies.sample_rows_gathering`): a greedy step reads
  no [R, V] count rows.
- `unchecked_bodies`: the remaining bodies listed in `helios.abi.cpu_bodies.UNCHECKED`.
- `helios.runtime.loading.fast_calls.bind_fast_calls`: aten overloads through torch's bindings.
- `helios.runtime.loading.repeated_calls.merge_repeated_calls`: a pure call repeated on the same
  unwritten arguments is made once.

A program with data-dependent (unbacked) shapes has no fast graph: its shapes may change between
calls, so every call is checked.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

from helios.abi import cpu_bodies
from helios.abi.paged_reference import attend, plan_attention
from helios.runtime.loading.fast_calls import bind_fast_calls
from helios.runtime.loading.repeated_calls import merge_repeated_calls

OP_META = "helios_op"  # node.meta key: (op name, the body the node was bound to)
_ATTENTION_OPS = ("helios::paged_attention", "helios::paged_attention_tuned")
_CHUNKED = "helios::paged_attention_chunked"  # its chunk (argument 8) joins the plan
_aten = torch.ops.aten
_VIEWS = (_aten.select.int, _aten.slice.Tensor, _aten.view.default, _aten.reshape.default)


def fast_graph(graph: torch.fx.Graph) -> torch.fx.Graph | None:
    """A rewritten copy of `graph` (see the module docstring); None for a graph with unbacked shapes."""
    if any(_unbacked(node) for node in graph.nodes):
        return None
    fast = _copy(graph)
    plan_steps(fast)
    sample_selected_rows(fast)
    unchecked_bodies(fast)
    bind_fast_calls(fast)
    merge_repeated_calls(fast)
    fast.lint()
    return fast


def _unbacked(node: torch.fx.Node) -> bool:
    # imported here: symbolic shapes import sympy, 2 s of a CUDA engine process's imports on an H100's host
    # (bench/results/h100_session67/call2), where no CPU program is built
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return any(free_unbacked_symbols(leaf) for leaf in tree_leaves(node.meta.get("val"))
               if isinstance(leaf, (torch.Tensor, torch.SymInt)))


def _copy(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of `graph` whose nodes share their meta values (read, never changed, here)."""
    copied = torch.fx.Graph()
    copied._codegen = graph._codegen
    nodes: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in graph.nodes:
        nodes[node] = copied.node_copy(node, lambda arg: nodes[arg])
    return copied


def _op(node: torch.fx.Node) -> str | None:
    """The ABI op a node calls through its registered body (None once it calls anything else,
    e.g. a sampling variant or a bound collective)."""
    bound = node.meta.get(OP_META) if node.op == "call_function" else None
    return bound[0] if bound is not None and node.target is bound[1] else None


def plan_steps(graph: torch.fx.Graph) -> int:
    """Rewrites attention, rotary and cache-write calls over shared step plans; returns how many."""
    plans: dict[tuple, torch.fx.Node] = {}

    def plan(key: tuple, before: torch.fx.Node, function, args: tuple) -> torch.fx.Node:
        if key not in plans:
            with graph.inserting_before(before):
                plans[key] = graph.call_function(function, args)
        return plans[key]

    count = 0
    for node in list(graph.nodes):
        op = _op(node)
        if op in _ATTENTION_OPS or op == _CHUNKED:
            q, k_cache, v_cache, page_table, query_start, positions, scale, window = node.args[:8]
            chunk = node.args[8] if op == _CHUNKED else 0  # (>= 1: the op refuses less)
            key = ("attention", page_table, query_start, positions, window, chunk, _root(k_cache))
            args = (page_table, query_start, positions, window, k_cache) + ((chunk,) if chunk else ())
            shared = plan(key, node, plan_attention, args)
            body = chunked_attention_planned if chunk else cpu_bodies.attention_planned
            node.target, node.args = body, (q, k_cache, v_cache, shared, scale)
        elif op == "helios::rotary_cache_write":
            q, k, v, cos, sin, k_cache, v_cache, slot_mapping = node.args
            slots = plan(("slots", slot_mapping), node, cpu_bodies.plan_slots, (slot_mapping,))
            shared = plan(("rotary", cos, sin, slots), node, cpu_bodies.plan_rotary, (cos, sin, slots))
            node.target, node.args = cpu_bodies.rotary_cache_write_planned, (q, k, v, k_cache, v_cache, shared)
        elif op == "helios::cache_write":
            k_cache, v_cache, k, v, slot_mapping = node.args
            slots = plan(("slots", slot_mapping), node, cpu_bodies.plan_slots, (slot_mapping,))
            node.target, node.args = cpu_bodies.cache_write_planned, (k_cache, v_cache, k, v, slots)
        else:
            continue
        count += 1
    return count


def chunked_attention_planned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan, scale: float):
    """``helios::paged_attention_chunked`` over its step plan (the chunk is the plan's). A body of its own,
    not `cpu_bodies.attention_planned`: the decode kernel binding (`decode_attention_kernel`) rebinds
    that one and its plans to a kernel that knows windows, not chunks."""
    return attend(plan, q, k_cache, v_cache, scale)


def _root(node) -> torch.fx.Node | None:
    """The placeholder a cache plane is a view of (through select/slice/view/reshape), if any:
    planes of one buffer share its page geometry."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _VIEWS:
        node = node.args[0]
    return node if isinstance(node, torch.fx.Node) and node.op == "placeholder" else None


def sample_selected_rows(graph: torch.fx.Graph) -> int:
    """Points sample calls whose tokens only one bool tensor selects at `sample_rows`; returns how many."""
    count = 0
    order = {node: index for index, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if _op(node) != "helios::sample":
            continue
        rows = _selecting_rows(node, order)
        if rows is None:
            continue
        gathers = _count_gathers(node, order)
        if gathers is None:
            node.target, node.args = cpu_bodies.sample_rows, (*node.args, rows)
        else:
            (prompt, output), slots = gathers
            unused = node.args[8:10]
            node.target = cpu_bodies.sample_rows_gathering
            node.args = (*node.args[:8], prompt, output, slots, *node.args[10:], rows)
            for gather in unused:
                graph.erase_node(gather)
        count += 1
    return count


def _count_gathers(node: torch.fx.Node, order: dict) -> tuple[tuple, torch.fx.Node] | None:
    """((prompt table, output table), slots) when the sample call's count arguments are
    ``aten.index.Tensor(table, [slots])`` of tables (placeholders) with the same slots, each gather
    used by this call only, and nothing but such gathers (or export's input guards) uses a table
    before the call (so gathering inside the call reads the same values); else None."""
    gathers = node.args[8:10]
    if len(node.args) != 12 or not all(isinstance(g, torch.fx.Node) for g in gathers):
        return None
    tables, slots = [], None
    for gather in gathers:
        if not (gather.op == "call_function" and gather.target is _aten.index.Tensor and not gather.kwargs
                and len(gather.args) == 2 and isinstance(gather.args[1], (list, tuple)) and len(gather.args[1]) == 1
                and list(gather.users) == [node]):
            return None
        table, (index,) = gather.args
        if not isinstance(table, torch.fx.Node) or table.op != "placeholder":
            return None
        if slots is not None and index is not slots:
            return None
        if any(order[user] < order[node] and not _reads_only(user) for user in table.users):
            return None
        tables.append(table)
        slots = index
    if tables[0] is tables[1] or not isinstance(slots, torch.fx.Node):
        return None
    return (tables[0], tables[1]), slots


def _selecting_rows(node: torch.fx.Node, order: dict) -> torch.fx.Node | None:
    """The bool node R (defined before `node`) when every use of `node` is ``where(R, node, other)``
    (the same R) or ``full_like(node, ...)`` (shape only), at least one a where; else None."""
    rows = None
    for user in node.users:
        if user.op == "call_function" and user.target is _aten.full_like.default and user.args[0] is node:
            if any(arg is node for arg in (*user.args[1:], *user.kwargs.values())):
                return None
            continue
        if not (user.op == "call_function" and user.target is _aten.where.self and len(user.args) == 3
                and user.args[1] is node and user.args[0] is not node and user.args[2] is not node and not user.kwargs):
            return None
        if rows is not None and user.args[0] is not rows:
            return None
        rows = user.args[0]
    value = rows.meta.get("val") if isinstance(rows, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or value.dim() != 1:
        return None
    return rows if order[rows] < order[node] else None


def _reads_only(node: torch.fx.Node) -> bool:
    """A row gather or the exported module's input guards: neither writes its inputs."""
    if node.op == "call_module":
        return node.target == "_guards_fn"
    return node.op == "call_function" and node.target is _aten.index.Tensor


def unchecked_bodies(graph: torch.fx.Graph) -> int:
    """Points the remaining bound bodies listed in `cpu_bodies.UNCHECKED` at them; returns how many."""
    count = 0
    for node in graph.nodes:
        body = cpu_bodies.UNCHECKED.get(_op(node))
        if body is not None:
            node.target = body
            count += 1
    return count
