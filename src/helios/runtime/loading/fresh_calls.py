"""Capture-time variant of a long prefill program for steps that hold one fresh prompt chunk.

A cold prompt's first chunk (no cached prefix) attends only to its own keys and values, which the
layer has just computed. `fresh_module` copies a program's graph with each layer's (rotary cache
write, attention over its planes) pair - or its fused ``helios::rotary_paged_attention`` call -
turned into ``helios::rotary_fresh_attention`` (`helios.abi.fresh_attention`): the same cache
writes, and causal attention over the fresh tensors by a fused kernel instead of reading them back
through the page table. Pairs with a window or sinks stay as they are (the fused kernels have
neither; the paged op is exact for any step).

That op is exact only for steps whose packed tokens are one chunk starting at position 0, so the
rewritten copy is captured as separate CUDA graphs (`helios.runtime.loading.cuda_graphs`) and
replayed only for such steps: the host decides from the plan it packs
(`helios.runtime.execution.program_variants.is_fresh_chunk`). Which programs get the copy
(`wants_fresh_graph`): prompt programs (prefill, mixed, scored prefill) of at least
`FRESH_MIN_TOKENS` packed tokens, where the fused kernel's saving outweighs the graphs' load time.
The prepared program and the CPU path are left as they are.
"""

from __future__ import annotations

import copy

import torch

import helios.abi.fresh_attention  # noqa: F401  (registers helios::rotary_fresh_attention)
from helios.contract import serving_pb2 as spb
from helios.runtime.loading.rotary_calls import ATTENTION_OPTIONALS, fusable_attention

__all__ = ["FRESH_MIN_TOKENS", "fresh_module", "rewrite_fresh_attention", "wants_fresh_graph"]

_OPS = torch.ops.helios
_FRESH = _OPS.rotary_fresh_attention.default
_FUSED = _OPS.rotary_paged_attention.default
# Prompt programs of at least this many packed tokens get fresh graphs: the long prefill launches
# (`helios.abi.triton_prefill_tiles.LONG_PREFILL_TOKENS`), where attention is a visible share of the
# step (2,048 cold tokens at 8B shapes: 3.5-4.7 of 46 ms); shorter ones would add graphs to load for
# little (bench/fresh_attention_ab.py measures 512 and 1,024 too).
FRESH_MIN_TOKENS = 1024
_PROMPT_OPERATIONS = (spb.GRAPH_OPERATION_PREFILL, spb.GRAPH_OPERATION_MIXED, spb.GRAPH_OPERATION_SCORED_PREFILL)


def wants_fresh_graph(program, min_tokens: int | None = None) -> bool:
    """Whether `program` (LoadedProgram) gets fresh-chunk graphs: a prompt program of at least
    `min_tokens` (default `FRESH_MIN_TOKENS`) packed tokens, more than its rows."""
    least = FRESH_MIN_TOKENS if min_tokens is None else min_tokens
    return (program.operation in _PROMPT_OPERATIONS and program.speculative is None
            and program.packed_token_capacity >= least and program.packed_token_capacity > program.batch_capacity)


def rewrite_fresh_attention(graph: torch.fx.Graph) -> int:
    """Rewrites every windowless, sinkless (rotary cache write, attention over its planes with its
    rotated q alone) pair, and every such fused call, into one ``helios::rotary_fresh_attention``
    call at the attention's place; returns how many. The caller recompiles the graph's module."""
    count = 0
    for node in list(graph.nodes):
        attention = _fresh_attention(node)
        if attention is None:
            continue
        if attention is node:  # a fused call: the prefetch hint is dropped
            node.target, node.args = _FRESH, (*node.args, *(None,) * (16 - len(node.args)))[:15]
        else:
            splits_at = ATTENTION_OPTIONALS[attention.target][1]
            args = attention.args
            attention.target = _FRESH
            attention.args = (*node.args, *args[3:8], None, None if splits_at is None else args[splits_at])
            graph.erase_node(node)
        count += 1
    return count


def _fresh_attention(node: torch.fx.Node) -> torch.fx.Node | None:
    """The call that `rewrite_fresh_attention` turns into the fresh op for `node`: `node` itself (a
    windowless, sinkless fused call), the attention it pairs with (a rotary cache write whose
    attention has neither), or None. Reads the graph only."""
    if node.op != "call_function" or node.kwargs:
        return None
    if node.target is _FUSED:
        args = (*node.args, *(None,) * (16 - len(node.args)))
        return node if args[12] == 0 and args[13] is None else None
    attention = fusable_attention(node)
    if attention is None or ATTENTION_OPTIONALS[attention.target][0] is not None or attention.args[7] != 0:
        return None
    return attention


def fresh_module(module):
    """A module computing `module`'s program for fresh-chunk steps (a new graph sharing `module`'s
    attributes; `module` is not changed), or None when it has no graph or no pair to rewrite (found
    before any copy is made)."""
    if not isinstance(module, torch.fx.GraphModule) \
            or not any(_fresh_attention(node) is not None for node in module.graph.nodes):
        return None
    graph = copy.deepcopy(module.graph)
    rewrite_fresh_attention(graph)
    return torch.fx.GraphModule(module, graph)
