"""Cold time to first token of a 2,048-token prompt on an 8B-shaped core: where the pages go and
where the request's wall time goes, in one process.

- pages: whether a cold prompt's page table is one run of consecutive ids (what the prefill
  kernel's descriptor path needs), in the fresh engine and after the pool's free pages are shuffled;
- allocator A/B: cold TTFT with the run allocator (`helios.runtime.cache.pages`) against the FIFO
  free list it replaced, over the same free pages in the shuffled order a long-serving FIFO pool
  ends up in (requests alternate, distinct prompts, medians);
- timeline: one cold request under the torch profiler: host time before the first kernel, the
  kernels' span, busy time and gaps (the largest with their neighbours), the time after the last
  kernel, the graph launch's CPU time, and the kernels by kind on the served page table;
- step A/B: the whole prefill step captured and replayed as served, with another long prefill tile,
  and with cuBLASLt preferred (the last request's buffers: a cold prompt on a page run).

    python bench/ttft_levers.py [--layers 32] [--repeats 5] [--json out.json]
    python bench/ttft_levers.py --wait FILE  # load, then measure once FILE exists (GPU tests beside it)
    python bench/ttft_levers.py --smoke   # tiny model on the CPU (checks the script runs)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lever_ab  # noqa: E402
from gpu_serving import log, time_to_first_token  # noqa: E402
from random_llama import LLAMA_31_8B, SMOKE, with_layers  # noqa: E402
from ttft_breakdown import prepared_core, prompt  # noqa: E402

from helios.runtime.cache.pages import PageAllocator  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.contract import StartupOptions  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402


class FifoAllocator(PageAllocator):
    """The allocator before page runs: a FIFO free list (freed pages appended, reused last), built
    from a live allocator's state with its free pages in `order`."""

    def __init__(self, live: PageAllocator, order: list[int]):  # noqa: super().__init__ would reset the state
        self.__dict__.update(live.__dict__)
        self._refs, self._map = list(live._refs), bytearray(live._map)
        self._order = deque(order)

    def allocate(self, count: int, follow: int | None = None) -> list[int] | None:
        if count > self._num_free:
            return None
        pages = [self._order.popleft() for _ in range(max(count, 0))]
        for page in pages:
            self._map[page] = 0
            self._refs[page] = 1
        self._num_free -= len(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        super().free(pages)
        self._order.extend(pages)


def runs_allocator(fifo: FifoAllocator) -> PageAllocator:
    """The run allocator over a FIFO allocator's state."""
    live = PageAllocator.__new__(PageAllocator)
    live.__dict__.update({name: value for name, value in fifo.__dict__.items() if name != "_order"})
    return live


class PageLog:
    """Records the pages of every allocation of several pages from `pool`."""

    def __init__(self, pool):
        self.runs: list[list[int]] = []
        allocate = pool.allocate

        def logged(count, follow=None):
            pages = allocate(count, follow)
            if pages and count > 1:
                self.runs.append(pages)
            return pages

        pool.allocate = logged

    def last_is_run(self) -> bool:
        pages = self.runs[-1] if self.runs else []
        return bool(pages) and pages == list(range(pages[0], pages[0] + len(pages)))


def cold_ttft(engine, vocab: int, length: int, salt: int) -> float:
    wall, reused = time_to_first_token(engine, prompt(length, vocab, salt))
    assert reused == 0, f"a cold prompt reused {reused} tokens"
    return wall


def fifo_order(allocator: PageAllocator, rng: random.Random) -> list[int]:
    """The free pages as a long-serving FIFO pool holds them: shuffled. Only the upper half's are
    shuffled, first (a FIFO request takes from them); the lower half's follow in order. The FIFO
    requests' pages stay cached (parked) afterwards, so they must not break up the lower half,
    where the run allocator's requests keep finding runs."""
    free = allocator.free_pages()
    upper = [page for page in free if page >= allocator.num_pages // 2]
    rng.shuffle(upper)
    return upper + [page for page in free if page < allocator.num_pages // 2]


def allocator_ab(engine, vocab: int, length: int, repeats: int, pages: PageLog) -> dict:
    """Cold TTFT, run allocator against the FIFO free list in shuffled order, alternating."""
    pool = engine.scheduler.cache.pool
    rng = random.Random(0)
    samples: dict[str, list[float]] = {"runs": [], "fifo": []}
    consecutive: dict[str, list[bool]] = {"runs": [], "fifo": []}
    for repeat in range(repeats):
        for kind in (("runs", "fifo") if repeat % 2 == 0 else ("fifo", "runs")):
            if kind == "fifo":
                pool.allocator = FifoAllocator(pool.allocator, fifo_order(pool.allocator, rng))
            try:
                samples[kind].append(cold_ttft(engine, vocab, length, 3000 + 2 * repeat + (kind == "fifo")))
            finally:
                if kind == "fifo":
                    pool.allocator = runs_allocator(pool.allocator)
            consecutive[kind].append(pages.last_is_run())
    result = {}
    for kind, walls in samples.items():
        result[kind] = {"median_ms": statistics.median(walls) * 1e3, "runs": consecutive[kind]}
        log(f"cold TTFT {length} tokens, {'run allocator' if kind == 'runs' else 'FIFO free list, shuffled':<26}: "
            f"{result[kind]['median_ms']:7.2f} ms median of {len(walls)} "
            f"(pages one run: {sum(consecutive[kind])}/{len(walls)})")
    saved = result["fifo"]["median_ms"] - result["runs"]["median_ms"]
    log(f"run allocator saves {saved:.2f} ms of cold TTFT against the shuffled FIFO free list")
    return result


def timeline(engine, vocab: int, length: int, top: int) -> dict:
    """One cold request under the profiler: host before the first kernel, the graph launch and its
    first kernel, kernel span, busy, gaps. Device events of over LONG_EVENT_US (not kernels: a
    record spanning the graph) are left out of busy time and kinds, and named."""
    on_cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_cuda else [])
    with torch.profiler.profile(activities=activities) as profile:
        with torch.profiler.record_function("ttft_request"):
            wall = cold_ttft(engine, vocab, length, 4242)
    events = profile.events()
    request = next(e for e in events if e.name == "ttft_request")
    origin = request.time_range.start
    device = sorted(lever_ab._kernels(profile, on_cuda), key=lambda e: e.time_range.start)
    kernels = [e for e in device if e.time_range.elapsed_us() <= LONG_EVENT_US]
    if not on_cuda or not kernels:
        log(f"timeline: wall {wall * 1e3:.2f} ms ({len(kernels)} top-level CPU ops; kernels on CUDA only)")
        return {"wall_ms": wall * 1e3}
    for event in device[:]:
        if event.time_range.elapsed_us() > LONG_EVENT_US:
            log(f"  left out: device event {event.name[:60]} of {event.time_range.elapsed_us() / 1e3:.2f} ms at "
                f"+{(event.time_range.start - origin) / 1e3:.2f} ms")
    first, last = kernels[0].time_range.start - origin, max(e.time_range.end for e in kernels) - origin
    busy, gaps, reach = 0.0, [], kernels[0].time_range.start
    for previous, kernel in zip([None, *kernels[:-1]], kernels):
        start, end = kernel.time_range.start, kernel.time_range.end
        if start > reach and previous is not None:
            gaps.append((start - reach, previous.name, kernel.name))
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    launches = [e for e in events if e.name in ("cudaGraphLaunch", "cudaGraphLaunch_v10000")]
    summary = {"wall_ms": wall * 1e3, "first_kernel_ms": first / 1e3, "span_ms": (last - first) / 1e3,
               "busy_ms": busy / 1e3, "gaps_ms": sum(g[0] for g in gaps) / 1e3, "gaps": len(gaps),
               "after_last_kernel_ms": wall * 1e3 - last / 1e3, "kernels": len(kernels),
               "graph_launch_cpu_ms": sum(e.cpu_time_total for e in launches) / 1e3,
               "graph_launch_at_ms": [(e.time_range.start - origin) / 1e3 for e in launches],
               "by_kind_ms": lever_ab._categories(kernels, on_cuda)}
    log(f"timeline of one cold request ({len(kernels)} kernels): wall {summary['wall_ms']:.2f} ms = host before the "
        f"first kernel {summary['first_kernel_ms']:.2f} + kernel span {summary['span_ms']:.2f} + after the last "
        f"{summary['after_last_kernel_ms']:.2f}; span = busy {summary['busy_ms']:.2f} + gaps {summary['gaps_ms']:.2f} "
        f"({len(gaps)} gaps); graph launches at {[round(t, 2) for t in summary['graph_launch_at_ms']]} ms, "
        f"{summary['graph_launch_cpu_ms']:.2f} ms of CPU")
    if launches:
        summary["graph"] = graph_window(launches[0], kernels, origin)
    log("kernels by kind: " + ", ".join(f"{k} {ms:.2f} ms" for k, ms in summary["by_kind_ms"].items()))
    if launches:
        summary["host_ops_before_launch"] = host_ops_before(events, request, launches[0], top)
    for entry in lever_ab._top_kernels(kernels, top):
        log(f"  {entry['ms']:8.3f} ms  x{entry['calls']:<4d} {entry['kernel']}")
    for gap, before, after in sorted(gaps, reverse=True)[:top]:
        log(f"  gap {gap:8.1f} us after {before[:50]} before {after[:50]}")
    return summary


LONG_EVENT_US = 5000.0


def graph_window(launch, kernels, origin: float) -> dict:
    """The graph launch's CPU call against the kernels from its start: when the device began, and
    the kernels' busy time and span from there."""
    after = [k for k in kernels if k.time_range.start >= launch.time_range.start]
    if not after:
        return {}
    begin, end = after[0].time_range.start, max(k.time_range.end for k in after)
    busy = sum(k.time_range.elapsed_us() for k in after)
    window = {"launch_start_ms": (launch.time_range.start - origin) / 1e3,
              "launch_end_ms": (launch.time_range.end - origin) / 1e3,
              "first_graph_kernel_ms": (begin - origin) / 1e3, "graph_span_ms": (end - begin) / 1e3,
              "graph_kernels_ms": busy / 1e3, "graph_kernels": len(after)}
    log(f"graph launch: CPU call +{window['launch_start_ms']:.2f} to +{window['launch_end_ms']:.2f} ms, first kernel "
        f"at +{window['first_graph_kernel_ms']:.2f} ms; {len(after)} kernels from there span "
        f"{window['graph_span_ms']:.2f} ms, {window['graph_kernels_ms']:.2f} ms of them summed")
    return window


def host_functions(engine, vocab: int, length: int, top: int) -> None:
    """cProfile of one cold request: the Python functions by own time (the graph replay and the
    wait for its result are in it as single entries)."""
    profiler = cProfile.Profile()
    profiler.enable()
    cold_ttft(engine, vocab, length, 5151)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    log("--- one cold request's host functions by own time")
    log("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))


STEP_TILES = ("ht128x128x8x3",)  # long tiles to try in the whole step beside the served one (one compile each)


def step_ab(model, length: int) -> dict:
    """The whole 2,048-token prefill step (the greedy program's eager module over the buffers of the
    last cold request: its pages are a run), captured into a CUDA graph per variant and replayed:
    as served, with each of STEP_TILES as the long prefill tile, and with cuBLASLt preferred. Device
    ms per step (median of 20 replays)."""
    from helios.abi import triton_prefill_tiles as tiles
    from helios.runtime.loading.cuda_graphs import CapturedProgram
    from helios.runtime.loading.model import program_arguments

    program = next((p for p in model.programs if p.graph == "prefill" and p.packed_token_capacity == length), None)
    if program is None:
        return {}
    modules = program.module.eager_modules if isinstance(program.module, CapturedProgram) else (program.module,)
    module = modules[-1] if modules[-1] is not None else modules[0]  # the greedy one where there is one
    arguments = program_arguments(program, model.weights, model.buffers)
    results = {"served": lever_ab.graph_ms(lambda: module(*arguments))}
    served_tile = tiles.LONG_PREFILL_TILES[128]
    for name in STEP_TILES:
        tiles.LONG_PREFILL_TILES[128] = tiles.parse_tile(name)
        try:
            results[f"tile {name}"] = lever_ab.graph_ms(lambda: module(*arguments))
        finally:
            tiles.LONG_PREFILL_TILES[128] = served_tile
    if torch.cuda.is_available():  # (without CUDA, for --smoke: the code path of the rest)
        previous = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            results["cuBLASLt"] = lever_ab.graph_ms(lambda: module(*arguments))
        finally:
            torch.backends.cuda.preferred_blas_library(previous)
    served = results["served"]
    for label, ms in results.items():
        log(f"prefill step T={length} ({served_tile.name} served), {label:<20}: {ms:7.3f} ms  "
            f"({served - ms:+.3f} ms against served)")
    return results


def wait_for(path: Path | None, seconds: float) -> None:
    """Until `path` exists (another user of the device is done), at most `seconds`."""
    if path is None:
        return
    started = time.perf_counter()
    while not path.exists() and time.perf_counter() - started < seconds:
        time.sleep(0.5)
    log(f"waited {time.perf_counter() - started:.1f} s for {path}" + ("" if path.exists() else " (not there: measuring)"))


def host_ops_before(events, request, launch, top: int) -> list[dict]:
    """Top-level CPU ops (and CUDA runtime calls) of the request that start before its first graph
    launch, by summed time: the host work the device waits for."""
    totals: dict[str, list[float]] = {}
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CPU or event is request or event is launch:
            continue
        if event.cpu_parent is not None and event.cpu_parent is not request:
            continue
        if not request.time_range.start <= event.time_range.start < launch.time_range.start:
            continue
        entry = totals.setdefault(event.name, [0.0, 0])
        entry[0] += event.time_range.elapsed_us()
        entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    log(f"host before the first graph launch ({(launch.time_range.start - request.time_range.start) / 1e3:.2f} ms "
        f"after the request began): top-level ops by summed time")
    for name, (us, calls) in ranked:
        log(f"  {us / 1e3:8.3f} ms  x{calls:<4d} {name[:90]}")
    return [{"op": name, "ms": us / 1e3, "calls": calls} for name, (us, calls) in ranked]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 2048; smoke 64)")
    parser.add_argument("--repeats", type=int, default=None, help="requests per allocator (default 5; smoke 2)")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--wait", type=Path, default=None,
                        help="after loading, measure only once this file exists (at most --wait-s seconds)")
    parser.add_argument("--wait-s", type=float, default=120.0)
    parser.add_argument("--pages", type=int, default=4096, help="cache pages of the pool")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    shape = SMOKE if args.smoke else with_layers(LLAMA_31_8B, args.layers)
    length = args.prompt or (64 if args.smoke else 2048)
    results: dict = {"layers": shape.num_hidden_layers, "prompt": length}
    with tempfile.TemporaryDirectory() as scratch:
        opened = prepared_core(Path(scratch), shape, length, (), device)
        started = time.perf_counter()
        # a fixed pool (8 GB at 8B shapes): the load leaves the device's memory to the tests beside it
        runtime = build_runtime(opened, RuntimeOptions(load=LoadOptions(
            StartupOptions(token_logprobs=False), device=str(device), cuda_graphs=device.type == "cuda",
            num_pages=args.pages)))
        log(f"loaded in {time.perf_counter() - started:.1f} s")
        wait_for(args.wait, args.wait_s)
        try:
            engine = runtime.engine
            pages = PageLog(engine.scheduler.cache.pool)
            first = cold_ttft(engine, shape.vocab_size, length, 1)  # warm-up: the fresh engine's first prompt
            results["fresh_engine"] = {"wall_ms": first * 1e3, "one_run": pages.last_is_run(),
                                       "first_page": pages.runs[-1][0] if pages.runs else None}
            log(f"fresh engine: the first cold prompt's pages are {'one run' if pages.last_is_run() else 'not one run'}"
                f" ({len(pages.runs[-1]) if pages.runs else 0} pages from {results['fresh_engine']['first_page']})")
            results["allocator_ab"] = allocator_ab(engine, shape.vocab_size, length,
                                                   args.repeats or (2 if args.smoke else 5), pages)
            results["timeline"] = timeline(engine, shape.vocab_size, length, args.top)
            host_functions(engine, shape.vocab_size, length, args.top + 8)
            results["step_ab"] = step_ab(runtime.model, length)
        finally:
            runtime.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
