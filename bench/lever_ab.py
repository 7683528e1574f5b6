"""Same-process A/B of the GPU decode levers, and where a decode step's time goes.

Used by `bench/anchor_compare.py` on a loaded runtime (importable on its own):

- `op_ab`: each fused ABI op (`helios.abi.fused`) against the torch sequence it replaced, and the
  greedy sampling kernel against the reference pipeline, at 8B shapes and several row counts. Each
  side is captured in a CUDA graph repeated as often as one decode step calls it (2 norms, 1 SiLU-mul
  and 1 rotary per layer; one sample per step) and replayed; the table gives ms per decode step.
- `sampling_program_ab`: the loaded DECODE programs captured again, greedy-only and full (with the
  random draws), each with the fused sampling pass and with the reference pipeline
  (`SampleVariant.REFERENCE*`): whole-step device ms of each.
- `decode_profile`: the torch profiler's top kernels of one eager decode step (the greedy graph's
  work), with the kernel count per step and the captured graph's replay time beside it.
"""

from __future__ import annotations

import copy
import time
from typing import Callable
from unittest import mock

import torch

from helios.abi import fused
from helios.abi.sampling import SampleVariant
from helios.runtime.loading.cuda_graphs import CapturedProgram, variant_module
from helios.runtime.loading.gemm_algos import sustained_replay_us
from helios.runtime.loading.model import program_arguments

OPS = torch.ops.helios
STEP_SUSTAIN_MS = 0.0  # > 0: whole-step A/Bs time back-to-back replays of about this long (anchor_compare --sustain-ms)


def graph_ms(call: Callable[[], object], repeat: int = 1, replays: int = 20, sustain_ms: float = 0.0) -> float:
    """Median device ms of one replay of a CUDA graph holding `repeat` calls of `call` (without
    CUDA, for `--smoke`: wall ms of `repeat` calls); with `sustain_ms`, the mean replay over the
    second half of back-to-back replays lasting about that long (the clock a long run holds)."""
    if not torch.cuda.is_available():
        return _wall_ms(call, repeat, replays=3)
    graph = captured_graph(call, repeat)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    median = sorted(times)[len(times) // 2]
    if sustain_ms > 0:
        median = sustained_replay_us(graph, max(4, round(sustain_ms / max(median, 1e-3)))) / 1e3
    graph.reset()
    return median


def captured_graph(call: Callable[[], object], repeat: int = 1):
    """A CUDA graph of `repeat` calls of `call`, captured after one warm-up call on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            call()
    return graph


def _wall_ms(call, repeat: int, replays: int) -> float:
    times = []
    for _ in range(replays):
        started = time.perf_counter()
        for _ in range(repeat):
            call()
        times.append(1e3 * (time.perf_counter() - started))
    return sorted(times)[len(times) // 2]


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reference_rotary(q, k, v, cos, sin, k_cache, v_cache, slots):
    return fused.reference_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slots)


def _op_cases(rows: int, shape, device) -> dict:
    """name -> (fused call, reference call, calls per decode step) at one row count."""
    dtype, hidden, width = torch.bfloat16, shape.hidden_size, shape.intermediate_size
    heads, kv_heads, head_dim = shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
    layers = shape.num_hidden_layers
    x, delta = (torch.randn(rows, hidden, device=device, dtype=dtype) for _ in range(2))
    weight = torch.randn(hidden, device=device, dtype=dtype)
    gate_up = torch.randn(rows, 2 * width, device=device, dtype=dtype)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, device=device, dtype=dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = q.view(rows, heads, head_dim), k.view(rows, kv_heads, head_dim), v.view(rows, kv_heads, head_dim)
    cos, sin = (torch.randn(rows, 1, head_dim, device=device, dtype=dtype) for _ in range(2))
    cache = torch.zeros(rows * 2 // 16 + 2, 16, kv_heads, head_dim, device=device, dtype=dtype)
    caches, slots = (cache, cache.clone()), torch.arange(rows, device=device, dtype=torch.int64)
    rotary = (q, k, v, cos, sin, *caches, slots)
    return {
        "add + RMSNorm": (lambda: OPS.add_rms_norm(x, delta, weight, 1e-5),
                          lambda: fused.reference_add_rms_norm(x, delta, weight, 1e-5), 2 * layers),
        "SiLU-mul": (lambda: OPS.silu_mul(gate_up), lambda: fused.reference_silu_mul(gate_up), layers),
        "rotary + cache write": (lambda: OPS.rotary_cache_write(*rotary), lambda: _reference_rotary(*rotary), layers),
        **_sample_case(rows, shape.vocab_size, device),
    }


def _sample_case(rows: int, vocab: int, device) -> dict:
    """``helios::sample`` with the fused pass vs the reference, greedy-only and drawing (T = 0.8,
    top-p 0.9) with every row constrained by an all-allowing mask, as programs call it."""
    logits = torch.randn(rows, vocab, device=device)
    zeros_f, zeros_i = torch.zeros(rows, device=device), torch.zeros(rows, dtype=torch.int32, device=device)
    seeds = torch.arange(rows, dtype=torch.int64, device=device)
    penalties = torch.tensor([[1.0, 0.0, 0.0]], device=device).repeat(rows, 1)
    counts = (torch.zeros(rows, vocab, dtype=torch.int32, device=device),) * 2
    mask = torch.full((rows, -(-vocab // 32)), -1, dtype=torch.int32, device=device)
    mask_rows = torch.ones(rows, dtype=torch.bool, device=device)
    cases = {}
    variants = (("greedy", 0.0, SampleVariant.GREEDY, SampleVariant.REFERENCE_GREEDY),
                ("drawing", 0.8, SampleVariant.FULL, SampleVariant.REFERENCE))
    for label, temperature, fused_variant, reference_variant in variants:
        arguments = (logits, seeds, seeds, zeros_f + temperature, zeros_i, zeros_f + 0.9, zeros_f, penalties,
                     *counts, mask, mask_rows)

        def fused_call(arguments=arguments, variant=fused_variant):
            return variant(*arguments)

        def reference_call(arguments=arguments, variant=reference_variant):
            return variant(*arguments)
        cases[f"sample, {label} ({vocab:,} vocabulary)"] = (fused_call, reference_call, 1)
    return cases


def op_ab(shape, rows_list, device, log) -> list[dict]:
    """Fused op vs torch sequence per decode step (ms), for every row count."""
    results = []
    for rows in rows_list:
        for name, (ours, theirs, per_step) in _op_cases(rows, shape, device).items():
            fast, slow = graph_ms(ours, per_step), graph_ms(theirs, per_step)
            results.append({"rows": rows, "op": name, "calls_per_step": per_step, "fused_ms": fast,
                            "reference_ms": slow, "saved_ms": slow - fast})
            log(f"lever A/B R={rows} {name} x{per_step}: fused {fast:.3f} ms, reference {slow:.3f} ms per step")
    return results


def decode_programs(model) -> list:
    return sorted((p for p in model.programs if p.graph == "decode"), key=lambda p: p.batch_capacity)


def diverse_rows(model, program, log=None) -> None:
    """Fills the decode step's token ids with random ids, one per row. After a served run the step
    buffers hold what the last steps left (rows that ended, padding), and the power a 256-row step
    draws depends on its data (`bench/power_floor.py --alike-rows`: one row repeated runs 1.15x
    faster at the cap than random rows): a replay on such rows is not the served step. Positions and
    page tables stay as they are (a step advances them; attention reads what they say)."""
    ids = model.buffers.get("token_ids")
    if ids is None:
        return
    rows = program.batch_capacity
    vocab = model.buffers["prompt_counts"].shape[-1] if "prompt_counts" in model.buffers else 1000
    if log is not None:
        log(f"decode step R={rows}: {ids[:rows].unique().numel()} distinct token ids in the step buffer's "
            f"{rows} rows before the fill")
    generator = torch.Generator(device=ids.device).manual_seed(rows)
    ids[:rows].copy_(torch.randint(0, vocab, (rows,), device=ids.device, generator=generator))


def _eager(program):
    """The exported module behind a captured program (or the program's own eager module)."""
    return program.module.eager_modules[0] if isinstance(program.module, CapturedProgram) else program.module


def sampling_program_ab(model, log) -> list[dict]:
    """Whole DECODE step device ms, greedy-only and full graphs: fused sampling pass vs reference."""
    results = []
    for program in decode_programs(model):
        arguments = program_arguments(program, model.weights, model.buffers)
        module = _eager(program)
        row = {"rows": program.batch_capacity}
        variants = (("greedy", SampleVariant.GREEDY, SampleVariant.REFERENCE_GREEDY),
                    ("full", SampleVariant.FULL, SampleVariant.REFERENCE))
        for graph, fused_variant, reference_variant in variants:
            for kind, variant in (("kernel", fused_variant), ("reference", reference_variant)):
                bound = variant_module(module, variant)
                row[f"{graph}_{kind}_ms"] = graph_ms(lambda bound=bound: bound(*arguments))
            log(f"{graph} decode step R={program.batch_capacity}: fused sampling {row[f'{graph}_kernel_ms']:.3f} ms, "
                f"reference sampling {row[f'{graph}_reference_ms']:.3f} ms")
        results.append(row)
    return results


def decode_profile(model, rows: int, top: int, log) -> dict:
    """Top kernels of one eager greedy decode step at `rows`, the kernel count, graph replay ms."""
    program = next((p for p in decode_programs(model) if p.batch_capacity == rows), None)
    if program is None:
        return {}
    arguments = program_arguments(program, model.weights, model.buffers)
    diverse_rows(model, program, log)
    module = variant_module(_eager(program), SampleVariant.GREEDY)
    on_cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_cuda else [])
    module(*arguments)
    _synchronize()
    with torch.profiler.profile(activities=activities) as profile:
        module(*arguments)
        _synchronize()
    kernels = _kernels(profile, on_cuda)
    replay = _replay_ms(program)
    busy_ms = sum(_self_us(e, on_cuda) for e in kernels) / 1e3
    order = "self_device_time_total" if on_cuda else "self_cpu_time_total"
    table = profile.key_averages().table(sort_by=order, row_limit=top, max_name_column_width=70)
    log(f"decode step R={rows}: {len(kernels)} kernels, {busy_ms:.3f} ms of kernel time; "
        f"the captured greedy graph replays in {replay:.3f} ms")
    log(table)
    shares = _categories(kernels, on_cuda)
    log(f"decode step R={rows} by kind: " + ", ".join(f"{kind} {ms:.3f} ms" for kind, ms in shares.items()))
    served = _replay_profile(program, rows, top, log)
    if served and STEP_SUSTAIN_MS > 0:
        served["capped"] = _capped_profile(program.module.replay, rows, served, log)
    return {"rows": rows, "kernels": len(kernels), "kernel_ms": busy_ms, "graph_replay_ms": replay,
            "by_kind_ms": shares, "top": _top_kernels(kernels, top), "served_graph": served}


def _replay_profile(program, rows: int, top: int, log) -> dict | None:
    """The kernels of one replay of the captured greedy graph as served (the eager step above binds
    the reference sampling and keeps the count gathers that the served graph drops)."""
    replay = getattr(program.module, "replay", None)
    if replay is None or not torch.cuda.is_available():
        return None
    replay(greedy=True)
    _synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        replay(greedy=True)
        _synchronize()
    kernels = _kernels(profile, True)
    if not kernels:
        log(f"served greedy graph R={rows}: the profiler saw no kernels of the replay")
        return None
    busy_ms = sum(_self_us(e, True) for e in kernels) / 1e3
    span_ms = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / 1e3
    shares = _categories(kernels, True)
    ranked = _top_kernels(kernels, top)
    # Under programmatic dependent launch a kernel starts before the previous one ends and waits on the
    # device: the profiler charges the wait to it, so kernel times overlap and may sum past the span.
    log(f"served greedy graph R={rows}: {len(kernels)} kernels, {busy_ms:.3f} ms of kernel time in a {span_ms:.3f} ms "
        "span (kernels under dependent launch overlap their predecessors); by kind: "
        + ", ".join(f"{kind} {ms:.3f} ms" for kind, ms in shares.items()))
    for entry in ranked:
        log(f"  {entry['ms']:8.3f} ms  x{entry['calls']:<4d} {entry['kernel']}")
    return {"kernels": len(kernels), "kernel_ms": busy_ms, "span_ms": span_ms, "by_kind_ms": shares, "top": ranked}


def _capped_profile(replay, rows: int, rested: dict, log, profiled: int = 8) -> dict | None:
    """The kinds' ms a replay of the served greedy graph at the clock a long run holds: under the
    profiler, replays back to back for about `STEP_SUSTAIN_MS` (the device reaches its power cap at
    256 rows) and `profiled` more, of which the last `profiled` replays' kernels are kept (a profiler
    started after the warm replays lets the device idle first, and its clock recover), beside the
    rested replay's (`rested`)."""
    warm = max(4, round(STEP_SUSTAIN_MS / max(rested["span_ms"], 1e-3)))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(warm + profiled):
            replay(greedy=True)
        _synchronize()
    kernels = sorted(_kernels(profile, True), key=lambda event: event.time_range.start)
    kept = profiled * rested["kernels"]
    if len(kernels) < kept:
        log(f"served greedy graph R={rows} after {STEP_SUSTAIN_MS:.0f} ms back to back: the profiler saw "
            f"{len(kernels)} kernels, fewer than {profiled} replays'")
        return None
    kernels = kernels[-kept:]
    replays = float(profiled)
    span_ms = (kernels[-1].time_range.end - kernels[0].time_range.start) / 1e3 / replays
    shares = {kind: ms / replays for kind, ms in _categories(kernels, True).items()}
    log(f"served greedy graph R={rows} after {STEP_SUSTAIN_MS:.0f} ms back to back: the last {profiled} replays "
        f"span {span_ms:.3f} ms each ({span_ms / rested['span_ms']:.2f}x rested); a replay by kind, capped against "
        "rested: "
        + ", ".join(f"{kind} {ms:.3f} ms ({ms / rested['by_kind_ms'][kind]:.2f}x)" if rested["by_kind_ms"][kind]
                    else f"{kind} {ms:.3f} ms" for kind, ms in shares.items()))
    before = {entry["kernel"]: entry["ms"] for entry in rested["top"]}
    for entry in _top_kernels(kernels, len(rested["top"])):
        ms = entry["ms"] / replays
        ratio = f" ({ms / before[entry['kernel']]:.2f}x rested)" if before.get(entry["kernel"]) else ""
        log(f"  {ms:8.3f} ms  x{round(entry['calls'] / replays):<4d} {entry['kernel']}{ratio}")
    return {"replays": replays, "span_ms": span_ms, "by_kind_ms": shares}


_KINDS = (  # kernel-name fragments -> kind, first match wins (attention first: cuDNN's fused SDPA kernels
    # may carry "xmma" in their names)
    ("attention", ("_decode_kernel", "_combine_kernel", "_prefill_kernel", "paged_attention", "sdpa", "fmha",
                   "flash_fwd", "fresh_attention", "_zero_outside_rows")),
    ("matmul", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitk", "aten::mm", "aten::linear", "_skinny")),
    ("fused norm/rotary/SiLU", ("_rms_norm_kernel", "_rotary_cache_write_kernel", "_silu_mul_kernel",
                                "rms_norm", "rotary_cache_write", "silu_mul")),
    ("sampling", ("_greedy_", "sort", "scan", "cumsum", "helios::sample")),
)


def _categories(kernels, on_cuda: bool) -> dict[str, float]:
    """Kernel ms per kind (matmul, attention, fused elementwise, sampling, other)."""
    totals = {kind: 0.0 for kind, _ in _KINDS} | {"other": 0.0}
    for event in kernels:
        name = event.name.lower()
        kind = next((k for k, fragments in _KINDS if any(f.lower() in name for f in fragments)), "other")
        totals[kind] += _self_us(event, on_cuda) / 1e3
    return totals


def _replay_ms(program, replays: int = 20) -> float:
    replay = getattr(program.module, "replay", None)
    if replay is None or not torch.cuda.is_available():
        return float("nan")
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay(greedy=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _kernels(profile, on_cuda: bool) -> list:
    """Device kernels of the profiled step (without CUDA: the top-level CPU ops, for `--smoke`)."""
    events = profile.events()
    if on_cuda:
        return [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    return [e for e in events if e.cpu_parent is None]


def _self_us(event, on_cuda: bool) -> float:
    return event.device_time if on_cuda else event.cpu_time_total


def _top_kernels(kernels, top: int) -> list[dict]:
    on_cuda = torch.cuda.is_available()
    totals: dict[str, list[float]] = {}
    for event in kernels:
        entry = totals.setdefault(event.name, [0.0, 0])
        entry[0] += _self_us(event, on_cuda) / 1e3
        entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    return [{"kernel": name[:90], "ms": ms, "calls": calls} for name, (ms, calls) in ranked]


COMMITTED_SKINNY: dict | None = None  # the committed SKINNY_TILES where a bench run added entries to them


def skinny_program_ab(model, rows_list, log, rounds: int = 3) -> list[dict]:
    """Whole greedy DECODE step device ms at each of `rows_list`, the projections named by
    `gemv_tiles.SKINNY_TILES` on the Triton skinny kernel (the SiLU-mul apart, and fused into the
    gate/up projection) against all on cuBLAS (same module otherwise), alternated `rounds` times;
    the median of each side. The captured module's fused calls are split again first. Where
    `COMMITTED_SKINNY` differs from the table (`anchor_compare.py --skinny-table` added entries), the
    first side is the committed table's binding, fused as served, so each ratio is against it."""
    from helios.abi import gemv_tiles, triton_skinny
    from helios.runtime.loading.gemv_calls import bind_gemv

    def bound_with(table: dict, module, fuse: bool) -> tuple[torch.fx.GraphModule, int]:
        """`module` with its projections bound as `table` says (the served table put back after)."""
        with mock.patch.dict(gemv_tiles.SKINNY_TILES, table, clear=True):
            graph = copy.deepcopy(module.graph)
            bound = bind_gemv(graph, fuse_silu=fuse)
        return torch.fx.GraphModule(module, graph), bound

    def sides(program):
        cublas = _unfused_silu(variant_module(_eager(program), SampleVariant.GREEDY), triton_skinny.skinny_silu_linear)
        cublas = _with_linear_targets(cublas, lambda node: node.target is triton_skinny.skinny_linear,
                                      torch.ops.aten.linear.default)
        modules = {"cublas": cublas}
        if COMMITTED_SKINNY is not None and COMMITTED_SKINNY != gemv_tiles.SKINNY_TILES:
            modules = {"committed": bound_with(COMMITTED_SKINNY, cublas, True)[0], **modules}
        for side, fuse in (("skinny", False), ("skinny+silu", True)):
            modules[side], bound = bound_with(dict(gemv_tiles.SKINNY_TILES), cublas, fuse)
        fused = sum(node.target is triton_skinny.skinny_silu_linear for node in modules["skinny+silu"].graph.nodes)
        return modules, f"{bound} projections bound, {fused} SiLU-muls fused"

    return _step_ab(model, rows_list, sides, "skinny", log, rounds)


def runs_program_ab(model, rows_list, log, rounds: int = 3) -> list[dict]:
    """Whole greedy DECODE step device ms at each of `rows_list`: the greedy graph's module as
    captured against the same with its runs of small integer elementwise calls fused
    (`elementwise_runs.runs_module`, the capture option `FUSE_RUNS`), alternated `rounds` times."""
    from helios.runtime.loading.elementwise_runs import runs_module

    def sides(program):
        served = program.module.eager_modules[1]  # the greedy graph's module
        fused = runs_module(served, enabled=True)
        calls = lambda module: sum(node.op == "call_function" for node in module.graph.nodes)  # noqa: E731
        return {"unfused": served, "fused": fused}, f"{calls(served)} -> {calls(fused)} calls"

    return _step_ab(model, rows_list, sides, "runs", log, rounds)


class _Flagged(torch.nn.Module):
    """`module` called with `owner.<flag>` set to `value` (what it launches, or a graph captures
    from it, follows that setting), restored afterwards."""

    def __init__(self, module, owner, flag: str, value: bool):
        super().__init__()
        self.module, self.owner, self.flag, self.value = module, owner, flag, value

    def forward(self, *arguments):
        before = getattr(self.owner, self.flag)
        setattr(self.owner, self.flag, self.value)
        try:
            return self.module(*arguments)
        finally:
            setattr(self.owner, self.flag, before)


def pdl_program_ab(model, rows_list, log, rounds: int = 3) -> list[dict]:
    """Whole greedy DECODE step device ms at each of `rows_list`: the greedy graph's module as
    served with its Triton norm and skinny kernels launched without programmatic dependent launch
    against with it (`helios.abi.dependent_launch`), alternated `rounds` times; the logits of both
    from the same state (the same bits expected)."""
    from helios.abi import dependent_launch

    def sides(program):
        served = program.module.eager_modules[1]  # the greedy graph's module
        return {"off": _Flagged(served, dependent_launch, "ENABLED", False),
                "pdl": _Flagged(served, dependent_launch, "ENABLED", True)}, "dependent launch"

    return _step_ab(model, rows_list, sides, "pdl", log, rounds)


def lt_program_ab(model, rows_list, log, rounds: int = 3) -> list[dict]:
    """Whole greedy DECODE step device ms at each of `rows_list`: the greedy graph's module as served
    with its projections on ``F.linear`` (cuBLAS's pick) against on the cuBLASLt algorithms chosen at
    load (`helios.abi.cublaslt`, `helios.runtime.loading.gemm_algos`), alternated `rounds` times;
    the logits of both from the same state."""
    from helios.abi import cublaslt

    def sides(program):
        served = program.module.eager_modules[1]
        bound = sum(1 for node in served.graph.nodes if node.target is cublaslt.lt_linear)
        return ({"cublas": _Flagged(served, cublaslt, "ENABLED", False),
                 "cublaslt": _Flagged(served, cublaslt, "ENABLED", True)},
                f"cuBLASLt's chosen algorithms, {bound} projections bound")

    return _step_ab(model, rows_list, sides, "lt", log, rounds)


def product_program_ab(model, rows_list, log, rounds: int = 3) -> list[dict]:
    """Whole greedy DECODE step device ms at each of `rows_list`: the greedy graph as served before
    (the head's product widened to float32 logits, the bias added to them in place and put back,
    `greedy_rows` on them) against as served now (`greedy_rows_biased` on the product:
    `helios.runtime.loading.sampling_rewrite`), alternated `rounds` times."""
    from helios.abi.sampling_rows import greedy_rows_biased

    def sides(program):
        served = program.module.eager_modules[1]
        calls = sum(node.target is greedy_rows_biased for node in served.graph.nodes)
        return {"widened": _widened(served), "product": served}, f"{calls} sampling calls on the product"

    return _step_ab(model, rows_list, sides, "product", log, rounds)


def _widened(module):
    """A copy of `module` (fx) whose `greedy_rows_biased` calls sample float32 logits again, as the
    greedy graph did before: ``to(product, float32)``, the bias added in place around a `greedy_rows`
    call and the saved entries put back, the float32 logits returned."""
    from helios.abi.sampling_rows import greedy_rows, greedy_rows_biased

    aten = torch.ops.aten
    graph = copy.deepcopy(module.graph)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not greedy_rows_biased:
            continue
        product, ids, values, *rest = node.args
        with graph.inserting_before(node):
            logits = graph.call_function(aten.to.dtype, (product, torch.float32))
            clamped = graph.call_function(aten.clamp.default, (ids, 0))
            real = graph.call_function(aten.ge.Scalar, (ids, 0))
            zeros = graph.call_function(aten.zeros_like.default, (values,))
            bias = graph.call_function(aten.where.self, (real, values, zeros))
            saved = graph.call_function(aten.gather.default, (logits, 1, clamped))
            added = graph.call_function(aten.scatter_add_.default, (logits, 1, clamped, bias))
            rows = graph.call_function(greedy_rows, (added, *rest))
            graph.call_function(aten.scatter_.src, (logits, 1, clamped, saved))
        node.replace_all_uses_with(rows)
        graph.erase_node(node)
        product.replace_all_uses_with(logits, delete_user_cb=lambda user: user.op == "output")
    return torch.fx.GraphModule(module, graph)


def _step_ab(model, rows_list, make_sides, label: str, log, rounds: int) -> list[dict]:
    """Per DECODE program of `rows_list` rows: `make_sides(program)` -> ({side: module}, note); each
    side's median whole-step device ms over `rounds` alternated graph timings, the first side's
    against each other's, and each side's logits of one step from the same state against the first's."""
    results = []
    for program in (p for p in decode_programs(model) if p.batch_capacity in rows_list):
        if not isinstance(program.module, CapturedProgram):
            log(f"{label} decode step R={program.batch_capacity}: not a captured CUDA program (a CUDA load A/Bs it)")
            continue
        arguments = program_arguments(program, model.weights, model.buffers)
        diverse_rows(model, program)
        modules, note = make_sides(program)
        times = {side: [] for side in modules}
        for _ in range(rounds):
            for side, module in modules.items():
                times[side].append(graph_ms(lambda module=module: module(*arguments), sustain_ms=STEP_SUSTAIN_MS))
        medians = {side: sorted(values)[len(values) // 2] for side, values in times.items()}
        base, base_ms = next(iter(medians.items()))
        saved = _step_state(arguments)
        logits = []
        for module in modules.values():  # each side from the same state (a step advances its inputs)
            for tensor, copy_of in saved:
                tensor.copy_(copy_of)
            logits.append(_first_float(module(*arguments)))
        for side, value in list(zip(modules, logits))[1:]:  # the same step's logits against the first side's
            if value is not None and logits[0] is not None:
                difference = (logits[0].float() - value.float()).abs().max().item()
                agree = (logits[0].argmax(-1) == value.argmax(-1)).float().mean().item()
                note += f"; {side}: logits within {difference:.3g}, argmax agrees in {agree:.1%} of rows"
        row = {"rows": program.batch_capacity, "note": note, **{f"{side}_ms": ms for side, ms in medians.items()}}
        log(f"{label} decode step R={row['rows']} ({note}): {base} {base_ms:.3f} ms, "
            + ", ".join(f"{side} {ms:.3f} ms ({base_ms / ms:.3f}x)" for side, ms in list(medians.items())[1:])
            + "; rounds " + " / ".join(f"{side} {[round(t, 3) for t in values]}" for side, values in times.items()))
        results.append(row)
    return results


def _unfused_silu(module, fused_target):
    """A copy of `module` (fx) whose `fused_target` calls are ``silu_mul(aten.linear(x, w))`` again."""
    graph = copy.deepcopy(module.graph)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is fused_target:
            with graph.inserting_before(node):
                product = graph.call_function(torch.ops.aten.linear.default, node.args)
            node.target, node.args = torch.ops.helios.silu_mul.default, (product,)
    return torch.fx.GraphModule(module, graph)


def _step_state(arguments, most_bytes: int = 1 << 29) -> list:
    """(tensor, copy) of a step's input buffers under `most_bytes`: what a decode step advances (the
    pending tokens, counts, positions), not the weights (a list) or the cache planes, whose only
    write, the step's own position, each side makes again before reading it."""
    return [(tensor, tensor.clone()) for tensor in arguments
            if isinstance(tensor, torch.Tensor) and tensor.numel() * tensor.element_size() < most_bytes]


def _first_float(outputs):
    """The first floating-point tensor among a step's outputs (its logits), or None."""
    for value in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.clone()
    return None


def _with_linear_targets(module, chosen, target):
    """A copy of `module` (fx) whose call nodes `chosen` picks call `target` instead."""
    graph = copy.deepcopy(module.graph)
    for node in graph.nodes:
        if node.op == "call_function" and chosen(node):
            node.target = target
    return torch.fx.GraphModule(module, graph)
