"""Load-time choice of cuBLASLt algorithms for a program's projections (CUDA).

``F.linear`` runs cuBLAS's first heuristic pick for each shape, which at decode batches is not
always the fastest of the algorithms cuBLASLt offers: timed a few replays at a time on an H200 at
Llama-3.1-8B shapes, others ran the 256-row projections 1.09-1.12x and the 64-row LM head 1.09x as
fast (`bench/cublaslt_ab.py`, `bench/results/h200_session30_call1`); timed back to back, under the
device's power cap where a 256-row decode step runs, none was more than 1.04x
(`bench/results/h200_session31_call1`), and no whole decode step gained more than 1%, so the choice
is off by default. Which one wins depends on the device, the library version, the shape and the
clock, so it is measured here, on the device, when the programs are captured - the way
`tune_attention` picks decode splits - and nothing is decided while serving.

Capture points every ``aten.linear`` call that `lt_eligible` accepts (no bias, 16-bit,
`MIN_ROWS`..`MAX_ROWS` rows, a 2-D weight, and no Triton tile: `helios.runtime.loading.gemv_calls`)
at `helios.abi.cublaslt.lt_linear`, which is ``F.linear`` until a choice is registered for its shapes. `choose_algorithms` then times, once per
distinct shape on the device, ``F.linear`` against the first `CANDIDATES` algorithms of cuBLASLt's
heuristic under each workspace limit (in CUDA graphs cycling through up to `TIMING_BYTES` of distinct
weights, as a step reads its layers', `ROUNDS` alternated rounds), keeps a candidate only where it gives the same bits on every
call, lies within bfloat16 rounding of ``F.linear``'s result and is at least `MIN_GAIN` as fast, and
registers it (`helios.abi.cublaslt.choose`). Choices are kept for the process: a second load of
the same shapes reuses them.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["ENABLED", "Choice", "choose_algorithms", "chosen_so_far", "lt_eligible", "lt_shapes",
           "sustained_replay_us"]

log = logging.getLogger(__name__)

ENABLED = False  # opt-in (`bench/anchor_compare.py --gemm-algos on`): see the README's measurements
MIN_ROWS, MAX_ROWS = 2, 256  # one row: cuBLAS's GEMV pick was the fastest at every 8B shape
CANDIDATES = 8  # per workspace limit
MIN_GAIN = 1.03  # below this a candidate's edge is within a load's timing noise
ROUNDS = 3
GRAPH_US = 600.0  # device time of one timed graph replay (calls repeated to reach it)
TIMING_BYTES, MAX_COPIES = 2 << 30, 16  # distinct weights a timed graph cycles through: what a step's reads look
# like (one weight called again and again timed F.linear's 256-row kernels 10-20% faster than bench/cublaslt_ab.py
# does; over distinct weights they were still as fast as the best candidate: bench/results/h200_session30_call4)
SUSTAIN_MS = 0.0  # > 0: each side timed over back-to-back replays of about this long a round (the clock a long
# decode run holds the device at; a short timing runs at the boost clock): `bench/anchor_compare.py --gemm-sustain-ms`
_LINEAR = torch.ops.aten.linear.default
_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Choice:
    """One shape's outcome: ``F.linear``'s us a call, the chosen candidate's (or None) and its label,
    and the fastest candidate's us and label whether or not it was chosen (reports)."""

    shape: tuple
    f_linear_us: float
    chosen_us: float | None
    label: str | None
    best_us: float | None = None
    best_label: str | None = None

    @property
    def gain(self) -> float:
        return self.f_linear_us / self.chosen_us if self.chosen_us else 1.0


def lt_eligible(node: torch.fx.Node) -> bool:
    """Whether `node` is an ``aten.linear`` call to bind to `lt_linear`: `ENABLED`, cuBLASLt opened,
    no bias, static 16-bit shapes of `MIN_ROWS`..`MAX_ROWS` rows and a 2-D weight."""
    if not ENABLED or node.op != "call_function" or node.target is not _LINEAR:
        return False
    if (len(node.args) > 2 and node.args[2] is not None) or node.kwargs.get("bias") is not None:
        return False
    x, weight = (_static(arg) for arg in node.args[:2])
    if x is None or weight is None or weight.dim() != 2 or x.dim() == 0 or x.dtype != weight.dtype:
        return False
    if x.dtype not in _DTYPES or not MIN_ROWS <= math.prod(x.shape[:-1]) <= MAX_ROWS:
        return False
    from helios.abi import cublaslt

    return cublaslt.available()


def lt_shapes(modules) -> set[tuple]:
    """The (rows, out features, in features, dtype) of every `lt_linear` call in `modules`' graphs."""
    from helios.abi import cublaslt

    shapes = set()
    for module in modules:
        graph = getattr(module, "graph", None)
        for node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            if node.op == "call_function" and node.target is cublaslt.lt_linear:
                x, weight = (_static(arg) for arg in node.args[:2])
                if x is not None and weight is not None:
                    shapes.add((math.prod(x.shape[:-1]), weight.shape[0], weight.shape[1], weight.dtype))
    return shapes


_DONE: dict[tuple, Choice] = {}


def choose_algorithms(shapes, device: torch.device) -> list[Choice]:
    """Times and registers the algorithm of each shape in `shapes` on `device` (see the module
    docstring); shapes chosen before in this process are not timed again. Returns each shape's
    outcome. A shape whose timing fails keeps ``F.linear`` (logged)."""
    from helios.abi import cublaslt

    outcomes, started, timed = [], time.perf_counter(), 0
    for shape in sorted(shapes, key=lambda s: (s[0], s[1], s[2], str(s[3]))):
        key = (device.index, *shape)
        if key not in _DONE:
            try:
                _DONE[key] = _time_shape(shape, device)
                timed += 1
            except (RuntimeError, cublaslt.CublasLtError) as error:
                log.warning("cuBLASLt: rows %d, %dx%d left on F.linear: %s", *shape[:3], error)
                _DONE[key] = Choice(shape, math.nan, None, None)
        outcomes.append(_DONE[key])
    if timed:
        won = [c for c in outcomes if c.label]
        log.info("cuBLASLt: %d projection shapes timed in %.1f s; %d run another algorithm than F.linear's (%s)",
                 timed, time.perf_counter() - started, len(won),
                 ", ".join(f"{c.shape[0]}x{c.shape[1]}x{c.shape[2]} {c.gain:.3f}x" for c in won) or "none")
    return outcomes


def chosen_so_far() -> list[Choice]:
    """Every shape's outcome timed in this process so far (reports and benchmarks)."""
    return list(_DONE.values())


def _time_shape(shape: tuple, device: torch.device) -> Choice:
    with torch.cuda.device(device):
        choice = _timed_choice(shape, device)
    return choice


def _timed_choice(shape: tuple, device: torch.device) -> Choice:
    from helios.abi import cublaslt

    rows, out_features, in_features, dtype = shape
    weight_bytes = out_features * in_features * torch.tensor([], dtype=dtype).element_size()
    free, _total = torch.cuda.mem_get_info(device)
    footprint = min(TIMING_BYTES, free // 4)  # weights spread as a step's are: no L2 and few TLB hits
    copies = max(1, min(MAX_COPIES, footprint // weight_bytes))
    generator = torch.Generator(device=device).manual_seed(rows * 31 + out_features * 7 + in_features)
    weights = [torch.empty(out_features, in_features, device=device, dtype=dtype).normal_(
        0.0, in_features ** -0.5, generator=generator) for _ in range(copies)]
    x = torch.randn(rows, in_features, device=device, generator=generator).to(dtype)
    reference = F.linear(x, weights[0])
    product = cublaslt.LtProduct(rows, out_features, in_features, dtype)
    runs = {"F.linear": lambda w: F.linear(x, w)}
    for algo in product.candidates(CANDIDATES):
        if _usable(product, algo, x, weights[0], reference):
            runs[algo] = lambda w, algo=algo: product.run(x, w, algo)
    calls = _calls_per_graph(runs["F.linear"], weights)
    graphs = {side: _graph(run, weights, calls) for side, run in runs.items()}
    times = {side: [] for side in graphs}
    for _ in range(ROUNDS):
        for side, graph in graphs.items():
            times[side].append((_sustained_us(graph, SUSTAIN_MS) if SUSTAIN_MS > 0 else _replay_us(graph)) / calls)
    medians = {side: statistics.median(values) for side, values in times.items()}
    base = medians.pop("F.linear")
    best = min(medians, key=medians.get, default=None)
    fastest = (medians[best], best.label) if best is not None else (None, None)
    if best is None or base / medians[best] < MIN_GAIN:
        cublaslt.choose(product, None)
        return Choice(shape, base, None, None, *fastest)
    cublaslt.choose(product, best)
    return Choice(shape, base, medians[best], best.label, *fastest)


def _usable(product, algo, x, weight, reference) -> bool:
    """Whether `algo` runs, gives the same bits twice and lies within bfloat16 rounding of F.linear."""
    try:
        first = product.run(x, weight, algo)
        again = product.run(x, weight, algo)
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a candidate that cannot run here is not a choice
        return False
    scale = reference.float().abs().max().item() or 1.0
    return torch.equal(first, again) and torch.allclose(first.float(), reference.float(), rtol=0.0,
                                                        atol=scale * 2 ** -6)


def _calls_per_graph(run, weights) -> int:
    """Calls of one timed graph: about `GRAPH_US` of device time, from an eager estimate."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    run(weights[0])
    start.record()
    for weight in weights * 2:
        run(weight)
    end.record()
    end.synchronize()
    each_us = max(start.elapsed_time(end) * 1e3 / (2 * len(weights)), 1.0)
    return max(len(weights), min(64, round(GRAPH_US / each_us)))


def _graph(run, weights, calls: int):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(weights[0])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for index in range(calls):
            run(weights[index % len(weights)])
    graph.replay()
    return graph


def _replay_us(graph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def _sustained_us(graph, sustain_ms: float) -> float:
    return sustained_replay_us(graph, max(4, round(sustain_ms * 1e3 / _replay_us(graph))))


def sustained_replay_us(graph, replays: int) -> float:
    """us a replay of `graph` (a CUDA graph) over the second half of `replays` back-to-back replays:
    the clock a long run holds the device at, where one replay after an idle moment runs at boost."""
    start, middle, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    start.record()
    for index in range(replays):
        if index == replays // 2:
            middle.record()
        graph.replay()
    end.record()
    end.synchronize()
    return middle.elapsed_time(end) * 1e3 / (replays - replays // 2)


def _static(arg) -> torch.Tensor | None:
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or not all(isinstance(size, int) for size in value.shape):
        return None
    return value
