"""Load-time rewrite of a greedy graph's sampling call: counts read through the slots, padding skipped.

A program gathers each row's prompt and output counts from the per-slot tables before it samples
(``helios::sample(..., prompt_counts[slots], output_counts[slots], ...)`` with ``slots =
request_slots.clamp(min=0)``, `helios.ignition.program`): two [R, V] int32 copies per step (about
0.5 GB at 256 rows of a 128k vocabulary), although the greedy pass reads counts only in penalised
rows. In a program's greedy graph (`helios.runtime.loading.cuda_graphs.greedy_module`, where the call
is bound to `SampleVariant.GREEDY`) `bind_greedy_rows` replaces that call by
`helios.abi.sampling_rows.greedy_rows` on the tables and the unclamped ``request_slots``, and drops
the gathers: the same token in every row with a slot; rows past the live ones (slot -1, which
sample nothing: ``sample_rows`` is false there, so the program replaces their token by -1 anyway)
read nothing, where they used to take the float64 penalty path with slot 0's counts (their zero
padding parameters are not neutral penalties).

The logit bias: the program adds it to a copy of the logits (``scatter_add``, out of place: the
``logits`` output stays unbiased), another [R, V] float32 copy per step. In the greedy graph the
bias is added to the logits in place just before the sampling call and the overwritten entries
(at most R x `MAX_LOGIT_BIAS`, gathered first) are written back just after it: the call samples the
same values and every other reader, the ``logits`` output included, sees the unbiased ones bit
for bit.

Where the biased logits are the LM head's 16-bit product widened (``to(product, float32)``, its
only other reader the ``logits`` output) and the bias is ``scatter_add(logits, 1, clamp(ids, 0),
where(ids >= 0, values, 0))``, the call becomes `helios.abi.sampling_rows.greedy_rows_biased` on
the product itself, and neither [R, V] float32 tensor is made: the kernel widens the values as it
reads them and adds each row's bias in its combine (the same float32 sums, so the same tokens). The
greedy graph's ``logits`` output is then the product (the float32 output's values before widening):
no runtime reads a program's ``logits``, and a token-logprobs program, which reads its scores from
its own outputs, has no greedy graph. At 256 rows of a 128k vocabulary the widening was two
[R, V] copies, 0.1 ms of a 7.6 ms decode step on an H200.

Only the exact pattern is rewritten: both count arguments gathered by ``aten.index`` through one
``aten.clamp(slots, 0)`` node, and the tokens read only through ``where(sample_rows, tokens, -1)``
(so a row that does not sample returns -1 whatever the call gives it); anything else (a
tensor-parallel sampler, a speculative program's draws) is left as it is and `bind_greedy_rows`
counts nothing for it.
"""

from __future__ import annotations

import torch

from helios.abi.sampling import SampleVariant, sampling_call_targets
from helios.abi.sampling_rows import greedy_rows, greedy_rows_biased

_INDEX = torch.ops.aten.index.Tensor
_CLAMP = torch.ops.aten.clamp.default
_SCATTER_ADD, _SCATTER_ADD_ = torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_add_.default
_GATHER, _SCATTER_ = torch.ops.aten.gather.default, torch.ops.aten.scatter_.src
_FULL_LIKE, _WHERE = torch.ops.aten.full_like.default, torch.ops.aten.where.self
_TO, _GE, _ZEROS_LIKE = torch.ops.aten.to.dtype, torch.ops.aten.ge.Scalar, torch.ops.aten.zeros_like.default
_NARROW_DTYPES = (torch.bfloat16, torch.float16)  # products whose widening is a copy
# helios::sample's argument positions (`helios.abi.sampling.SAMPLE_SCHEMA`).
_LOGITS, _PENALTIES, _PROMPT_COUNTS, _OUTPUT_COUNTS, _GRAMMAR_MASK, _MASK_ROWS = 0, 7, 8, 9, 10, 11


def bind_greedy_rows(graph: torch.fx.Graph) -> int:
    """Rewrites every greedy sampling call of `graph` whose counts are gathered through clamped
    slots into a `greedy_rows` call (module docstring); returns how many. The caller recompiles."""
    greedy = sampling_call_targets(SampleVariant.GREEDY)
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in greedy or node.kwargs or len(node.args) != 12:
            continue
        gathered = _gathered_tables(node.args[_PROMPT_COUNTS], node.args[_OUTPUT_COUNTS])
        if gathered is None or not _kept_only_where_sampling(node):
            continue
        prompt_table, output_table, slots = gathered
        args = node.args
        with graph.inserting_before(node):
            rows = graph.call_function(greedy_rows, (args[_LOGITS], args[_PENALTIES], prompt_table, output_table,
                                                     slots, args[_GRAMMAR_MASK], args[_MASK_ROWS]))
        rows.meta = dict(node.meta)
        node.replace_all_uses_with(rows)
        dropped = [args[_PROMPT_COUNTS], args[_OUTPUT_COUNTS], args[_LOGITS]]
        graph.erase_node(node)
        if not _sample_the_product(graph, rows):
            _bias_in_place(graph, rows)
        _erase_unused(graph, dropped)
        count += 1
    return count


def _sample_the_product(graph: torch.fx.Graph, rows: torch.fx.Node) -> bool:
    """Where `rows` samples ``scatter_add(to(product, float32), 1, clamp(ids, 0), where(ids >= 0,
    values, 0))`` of a 16-bit product read by nothing else but the output, replaces it by
    `greedy_rows_biased` on the product, the ids and the values (module docstring); whether it did."""
    biased = rows.args[0]
    if not (_is_call(biased, _SCATTER_ADD, 4) and biased.args[1] == 1 and len(biased.users) == 1):
        return False
    widened, clamped, added = biased.args[0], biased.args[2], biased.args[3]
    if not (_is_call(widened, _TO, 2) and widened.args[1] == torch.float32 and _is_call(clamped, _CLAMP, 2)
            and clamped.args[1] == 0 and _is_call(added, _WHERE, 3)):
        return False
    product, ids = widened.args[0], clamped.args[0]
    condition, values, zeros = added.args
    if not (_is_call(condition, _GE, 2) and condition.args == (ids, 0) and isinstance(zeros, torch.fx.Node)
            and zeros.target is _ZEROS_LIKE and zeros.args == (values,)
            and all(v in (None, False) for v in zeros.kwargs.values()) and isinstance(product, torch.fx.Node)):
        return False
    value = product.meta.get("val")
    if getattr(value, "dtype", None) not in _NARROW_DTYPES or any(
            user is not biased and user.op != "output" for user in widened.users):
        return False
    with graph.inserting_before(rows):
        tokens = graph.call_function(greedy_rows_biased, (product, ids, values, *rows.args[1:]))
    tokens.meta = dict(rows.meta)
    rows.replace_all_uses_with(tokens)
    graph.erase_node(rows)  # the caller erases the biased copy, the widening and the bias arithmetic
    widened.replace_all_uses_with(product, delete_user_cb=lambda user: user.op == "output")
    return True


def _is_call(node: object, target, arity: int) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target
            and len(node.args) == arity and not node.kwargs)


def _bias_in_place(graph: torch.fx.Graph, rows: torch.fx.Node) -> None:
    """Where `rows` samples ``scatter_add(logits, 1, ids, values)`` (the logit bias added to a copy
    of the unbiased logits, which the program also returns), adds the bias to the logits in place
    just before the call and puts the saved entries back just after it: the same biased values for
    the call and the same unbiased logits for every other reader, without the [R, V] copy."""
    biased = rows.args[0]
    if not (_is_call(biased, _SCATTER_ADD, 4) and biased.args[1] == 1
            and all(isinstance(a, torch.fx.Node) for a in (biased.args[0], biased.args[2], biased.args[3]))):
        return
    logits, _, ids, values = biased.args
    with graph.inserting_before(rows):
        saved = graph.call_function(_GATHER, (logits, 1, ids))
        added = graph.call_function(_SCATTER_ADD_, (logits, 1, ids, values))
    rows.args = (added, *rows.args[1:])
    with graph.inserting_after(rows):
        graph.call_function(_SCATTER_, (logits, 1, ids, saved))


def _kept_only_where_sampling(node: torch.fx.Node) -> bool:
    """Whether the call's tokens are read only through ``where(sample_rows, tokens,
    full_like(tokens, -1))`` (`GenerationProgram.sample`): what it returns in rows that do not
    sample - the padding rows past the live ones among them - is discarded."""
    users = list(node.users)
    fills = [u for u in users if u.op == "call_function" and u.target is _FULL_LIKE and u.args[:2] == (node, -1)]
    if len(users) != 2 or len(fills) != 1:
        return False
    (chosen,) = [u for u in users if u is not fills[0]]
    condition = chosen.args[0] if chosen.args else None
    return (chosen.op == "call_function" and chosen.target is _WHERE and not chosen.kwargs
            and chosen.args[1:] == (node, fills[0]) and isinstance(condition, torch.fx.Node)
            and condition.op == "placeholder" and condition.target == "sample_rows")


def _gathered_tables(prompt: object, output: object):
    """(prompt table, output table, unclamped slots) when both count arguments are
    ``table[clamp(slots, 0)]`` through the same clamp node, else None."""
    if not all(isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target is _INDEX
               and len(n.args) == 2 and isinstance(n.args[1], (list, tuple)) and len(n.args[1]) == 1
               for n in (prompt, output)):
        return None
    index = prompt.args[1][0]
    if output.args[1][0] is not index or not isinstance(index, torch.fx.Node) or index.target is not _CLAMP:
        return None
    if index.kwargs or len(index.args) != 2 or index.args[1] != 0 or not isinstance(index.args[0], torch.fx.Node):
        return None  # clamp(slots, min=0) only: no max bound
    return prompt.args[0], output.args[0], index.args[0]


def _erase_unused(graph: torch.fx.Graph, nodes: list) -> None:
    """Erases `nodes` that nothing uses any more, then their inputs that nothing else uses (pure
    ops only: a node with side effects or a placeholder stays)."""
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if not isinstance(node, torch.fx.Node) or node.users or node.op != "call_function" or node.is_impure():
            continue
        inputs = list(node.all_input_nodes)
        graph.erase_node(node)
        pending.extend(inputs)
