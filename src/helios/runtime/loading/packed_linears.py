"""Projections of a compiled CPU program through oneDNN with weights packed at load.

A program's projections run ``aten.linear`` (MKL's sgemm on the plain [out, in] weight); Inductor
keeps them as extern GEMM calls in its segments (`helios.runtime.loading.program_compile`). At the
row counts of a batched decode step or a prompt chunk, oneDNN's inner product over a weight
reordered once into its blocked layout (``mkldnn._reorder_linear_weight``, for the call's row
count) computes the same product in about half the time on the larger projections (measured on
this project's 2-core machine, float32, one thread: 16 x 256 -> 1,024 in 63 us against 130 us,
64 rows 0.44-0.62x), while at one row, or on small projections, it is slower (16 x 128 -> 128:
15.5 us against 8.5 us; one row: 1.8-2.4x). Inductor lowers oneDNN's op only for weights it froze
itself, so a packed projection runs as an opaque call between compiled segments (`packed_linear`),
which costs a segment boundary where it splits one.

`pack_linears` rewrites, in a program's segment graph at compile time, each ``linear(x, W, b)``
whose weight is a float32 program input of the compiled tensors and whose input has a known static
2-D shape, when `packing_pays` for its shape: the call is measured at load both ways on the
compiled tensors' shapes (thread CPU time, alternated, medians of `ROUNDS` rounds) and packed when
oneDNN takes at most `RATIO` of the plain call's time and saves at least `MIN_SAVING` a call (what
a segment split by the opaque call costs, about 10-15 us on the 2-core machine: on the embedded
default model at 16 rows the head passes, on the 4-layer Llama most projections; a loaded machine
inflates both times, so more pass there). The choice is cached per shape for the process. Packed
weights are kept by the compiled module (one copy per weight and row count, shared between programs
of one load); the compiled graph runs only on the tensors it was compiled for, so the packed copy
is of the weights it reads.

Results equal the plain projection within float rounding (another blocking of the same sums), as
everything compiled does; the eager fast graph keeps ``aten.linear``.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

ROUNDS = 9  # alternated measurement rounds per shape
CALLS = 20  # calls per round
RATIO = 0.7  # packed when it takes at most this share of the plain call's time
MIN_SAVING = 15e-6  # and saves at least this many seconds a call (about what a split segment costs)

# A projection's call in a program graph: as exported, or bound to torch's binding (`fast_calls`).
LINEARS = frozenset({torch._C._nn.linear, torch.nn.functional.linear, torch.ops.aten.linear.default})
_choices: dict[tuple, bool] = {}


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``linear(x, W, bias)`` through oneDNN, `packed` being ``mkldnn._reorder_linear_weight(W, rows)``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def available() -> bool:
    """Whether this torch build has oneDNN's packed inner product on the CPU."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


Decision = Callable[[int, torch.Tensor, "torch.Tensor | None"], bool]


def pack_linears(module: torch.nn.Module, graph: torch.fx.Graph, real: dict[str, torch.Tensor], values: dict,
                 packed: dict | None = None, pays: Decision | None = None) -> int:
    """Points each eligible linear of `graph` (see the module docstring) at `packed_linear` over a
    packed copy of its weight, held by `module` as a buffer; returns how many. `real` maps
    placeholder names to the compiled tensors, `values` nodes to static fake values; `packed`
    shares packed weights between programs ((weight, rows) -> packed); `pays` decides (rows,
    weight, bias) (default: `packing_pays`)."""
    if not available():
        return 0
    decide = pays or packing_pays
    shared = {} if packed is None else packed
    count = 0
    for node in list(graph.nodes):
        chosen = _eligible(node, real, values)
        if chosen is None:
            continue
        rows, weight, bias = chosen
        if not decide(rows, weight, bias):
            continue
        key = (weight.data_ptr(), tuple(weight.shape), rows)
        if key not in shared:
            shared[key] = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        name = f"packed_weight_{count}"
        module.register_buffer(name, shared[key], persistent=False)
        with graph.inserting_before(node):
            attribute = graph.get_attr(name)
        node.target = packed_linear
        node.args = (node.args[0], attribute, node.args[2] if len(node.args) > 2 else node.kwargs.get("bias"))
        node.kwargs = {}
        count += 1
    return count


def _eligible(node: torch.fx.Node, real: dict, values: dict) -> tuple[int, torch.Tensor, torch.Tensor | None] | None:
    """(rows, weight, bias) of a linear over a float32 weight input and a static 2-D float32 input."""
    if node.op != "call_function" or node.target not in LINEARS or len(node.args) < 2:
        return None
    x, weight_node = node.args[0], node.args[1]
    bias_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    if not (isinstance(weight_node, torch.fx.Node) and weight_node.op == "placeholder"):
        return None
    weight = real.get(weight_node.name)
    example = values.get(x) if isinstance(x, torch.fx.Node) else None
    if not (isinstance(weight, torch.Tensor) and isinstance(example, torch.Tensor)):
        return None
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu" or not weight.is_contiguous():
        return None
    if example.dim() != 2 or example.dtype != torch.float32 or example.shape[1] != weight.shape[1]:
        return None
    bias = None
    if bias_node is not None:
        if not (isinstance(bias_node, torch.fx.Node) and bias_node.op == "placeholder"):
            return None
        bias = real.get(bias_node.name)
        if not (isinstance(bias, torch.Tensor) and bias.dtype == torch.float32 and bias.dim() == 1):
            return None
    return int(example.shape[0]), weight, bias


def packing_pays(rows: int, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `packed_linear` takes at most `RATIO` of ``linear``'s time for `rows` rows of this
    weight's shape (measured once per shape and process; see the module docstring)."""
    key = (rows, tuple(weight.shape), bias is not None)
    if key not in _choices:
        plain, packed = _measure(rows, weight, bias)
        _choices[key] = packed <= RATIO * plain and plain - packed >= MIN_SAVING
    return _choices[key]


def _measure(rows: int, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[float, float]:
    """Median thread CPU seconds a call of the plain and of the packed projection, alternated."""
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    plain_calls, packed_calls = [], []
    with torch.inference_mode():
        for _ in range(ROUNDS):
            plain_calls.append(_timed(lambda: torch._C._nn.linear(x, weight, bias)))
            packed_calls.append(_timed(lambda: packed_linear(x, packed, bias)))
    return statistics.median(plain_calls) / CALLS, statistics.median(packed_calls) / CALLS


def _timed(call: Callable[[], object]) -> float:
    started = time.thread_time()
    for _ in range(CALLS):
        call()
    return time.thread_time() - started
