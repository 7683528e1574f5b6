"""Where cold start goes: prepare and load of an 8B-shaped core, phase by phase, with and without the
token-logprobs program variants (``helios prepare --no-logprobs``), and the core that holds them loaded
without them (``helios serve --no-logprobs``).

One random Llama-3.1-8B-shaped checkpoint (``--layers``) is written once; for each variant the core is
prepared and then loaded (``build_runtime``: verify, programs, weights, tuning producers, CUDA graph
capture on a GPU). Phases are timed by wrapping the functions that do them (the wrappers add nothing
measurable); "other" is the rest of the stage. Prints one table per stage and variant, the ratio of the
two variants, and the functions with the most own time in each stage (cProfile, ``--profile``; on Python
3.12 it mixes every thread's calls) or where the stage's own thread spends its wall time (``--sample``: its
stack sampled every 2 ms, `bench/stack_sampler.py`).

    python bench/cold_start.py [--layers 32] [--variants logprobs,no-logprobs] [--json out.json]
        [--skip-no-logprobs-load] [--keep-core DIR]   # DIR: the first variant's core, for ttft_breakdown --core
        [--chunks 128,256,512]   # the prompt capacities beside 2,048 (each adds programs to load)
    python bench/cold_start.py --core DIR   # load a kept core again (no prepare), in a fresh process
    python bench/cold_start.py --smoke    # tiny model on the CPU (checks the script runs)
"""

from __future__ import annotations

import argparse
import cProfile
import contextlib
import gc
import importlib
import io
import json
import logging
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compile_dispatch import describe as describe_dispatch  # noqa: E402
from gpu_serving import NAMESPACE, Workload, log, prefill_chunks  # noqa: E402
from stack_sampler import StackSampler  # noqa: E402
from random_llama import LLAMA_31_8B, SMOKE, LlamaShape, with_layers, write_random_llama  # noqa: E402

from helios.contract import StartupOptions  # noqa: E402
from helios.core.keys import SigningKey, load_signing_key, write_key_pair  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.runtime.loading import kernel_precompile  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

# A model with real weight traffic that still prepares in a minute on a CPU (--medium).
MEDIUM = LlamaShape(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16,
                    num_key_value_heads=4, head_dim=128, vocab_size=32000)
THREADED = "[thread] "  # a phase that runs beside the others (not part of the stage's sum)
# (module, attribute, phase): the functions timed; a phase may gather several. None of them calls
# another of its stage's list, so the phases do not overlap.
PREPARE_PHASES = (
    ("helios.ignition.export", "load_checkpoint", "read checkpoint"),
    ("helios.ignition.export", "rank_weight_files", "weight images"),
    ("helios.ignition.export", "read_assets", "tokenizer + assets"),
    ("helios.ignition.export", "capture_all", "export programs (worker processes)"),
    ("helios.core.writer", "store_resource", "[overlaps capture] compress + store resources"),
    ("helios.ignition.export", "declare_paged_text", "declare contract + manifest"),
    ("helios.core.writer", "encode_payload", "encode + sign payload"),
    ("helios.core.writer", "seal", "encode + sign payload"),
    ("helios.core.container", "ContainerWriter.commit", "commit container (fsync, rename)"),
)
IN_LOAD_MODEL = "[total] load_model"  # the phases below it, the weights thread, and its own rest
LOAD_PHASES = (
    ("helios.runtime.service", "load_model", IN_LOAD_MODEL),
    ("helios.runtime.loading.model", "check_servable", "check contract"),
    ("helios.runtime.loading.programs", "_program_bytes", "program bytes (decompress, verify)"),
    ("helios.runtime.loading.programs", "read_program_image", "program images (parse)"),
    ("helios.runtime.loading.programs", "validate_serialized_ops", "validate ops"),
    ("helios.runtime.loading.programs", "validate_program_ops", "validate ops"),
    ("helios.runtime.loading.programs", "build_module", "program modules (built from the JSON)"),
    ("helios.runtime.loading.program_cache", "deserialize_program", "deserialize programs (torch's path)"),
    ("helios.runtime.loading.programs", "move_module", "programs to device"),
    ("torch.export.exported_program", "ExportedProgram.module", "program modules (unflatten)"),
    ("helios.runtime.loading.programs", "finish_recompile", "program code (generated once)"),
    ("helios.runtime.loading.programs", "drop_no_op_nodes", "drop no-op nodes"),
    ("helios.runtime.loading.programs", "cpu_program", "CPU program rewrite"),
    ("helios.runtime.loading.model", "_load_weights", THREADED + "weights (decode, verify, copy)"),
    ("helios.runtime.loading.model", "default_pages", "size the page pool"),
    ("helios.runtime.loading.model", "_allocate", "allocate caches"),
    ("helios.runtime.loading.model", "run_producers", "tuning producers"),
    ("helios.runtime.loading.model", "capture_programs", "CUDA graph capture"),
    ("helios.runtime.loading.model", "use_cpu_kernels", "CPU kernels (build, bind, pack)"),
    ("helios.runtime.loading.model", "check_ahead", "CPU programs' first, checked calls"),
    ("helios.runtime.loading.model", "plan_captures", "capture plans (graph modules, beside the weights)"),
    ("helios.runtime.loading.cuda_graphs", "greedy_module", "[in the plans] greedy graph copies"),
    ("helios.runtime.loading.model", "_dry_run_ahead", "stand-ins for the dry run (allocate, producers)"),
    ("helios.runtime.loading.dry_run_ahead", "DryRunAhead.__call__", "[in the plans] dry run on stand-ins"),
    ("helios.runtime.loading.dry_run_ahead", "DryRunAhead.close", "[in the plans] dry run: device, free"),
    ("helios.runtime.loading.cuda_graphs", "_precompile", "[in capture] Triton precompile (dry run + workers)"),
    ("helios.runtime.loading.kernel_precompile", "KernelCompiler.wait", "[in precompile] waiting for workers"),
    ("helios.runtime.loading.cuda_graphs", "_warm_up", "[in capture] warm-up runs"),
    ("helios.runtime.loading.cuda_graphs", "_record_graph", "[in capture] record + instantiate"),
)


class PhaseTimer:
    """Wraps module functions to sum their wall time per phase (calls counted); restores on exit."""

    def __init__(self, phases):
        self.phases, self.seconds, self.calls, self._saved = phases, {}, {}, []

    def __enter__(self) -> "PhaseTimer":
        found = []
        for module_name, attribute, phase in self.phases:
            owner = importlib.import_module(module_name)
            *path, name = attribute.split(".")  # "Class.method" wraps a method on its class
            for part in path:
                owner = getattr(owner, part)
            inner = getattr(owner, name, None)
            if inner is None:  # a phase the tree loaded (bench/load_ab.sh's other side) does not have
                continue
            found.append((module_name, attribute, phase))
            self._saved.append((owner, name, inner))
            setattr(owner, name, self._timed(inner, phase))
        self.phases = tuple(found)
        return self

    def _timed(self, inner, phase: str):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
                self.calls[phase] = self.calls.get(phase, 0) + 1
        return call

    def __exit__(self, *exc) -> None:
        for module, attribute, inner in reversed(self._saved):
            setattr(module, attribute, inner)


def plan_for(ttft_prompt: int, logprobs: bool, smoke: bool, chunks: tuple[int, ...] | None = None) -> CapacityPlan:
    """The capacities of `bench/anchor_compare.py`'s core (decode 1/64/256, prefill up to 2,048 with
    the 128/256/512 chunks, mixed), with or without the token-logprobs variants."""
    workloads = [Workload(1, 128, 128), Workload(64, 128, 128), Workload(256, 128, 128), Workload(64, 1024, 1024)]
    if smoke:
        workloads = [Workload(1, 16, 8), Workload(4, 16, 8)]
    context = max([w.prompt + w.output for w in workloads] + [ttft_prompt + 16])
    pages = max(w.requests * -(-(w.prompt + w.output) // 16) for w in workloads) + 4 * -(-context // 16)
    prefill = min(2048, context)
    chunks = prefill_chunks(prefill) if chunks is None else tuple(c for c in chunks if 0 < c < prefill)
    return CapacityPlan(page_tokens=16, context_tokens=context, prefill_tokens=prefill,
                        decode_batches=tuple(sorted({w.requests for w in workloads} | {1})), prefill_batches=(1,),
                        mixed=True, page_capacity=max(pages, 2 * context // 16), prefill_chunks=chunks,
                        token_logprobs=logprobs)


@contextlib.contextmanager
def profiled(enabled: bool, title: str, rows: int):
    profiler = cProfile.Profile() if enabled else None
    if profiler:
        profiler.enable()
    try:
        yield
    finally:
        if profiler:
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(rows)
            log(f"--- {title}: functions by own time")
            log("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))


@contextlib.contextmanager
def sampled(enabled: bool, title: str, rows: int):
    if not enabled:
        yield
        return
    with StackSampler(threading.current_thread()) as sampler:
        yield
    log(sampler.report(rows, f"{title}: the stage's thread, sampled"))


@contextlib.contextmanager
def torch_profiled(enabled: bool, title: str, rows: int):
    """torch's profiler (ops and, on CUDA, the runtime API calls: launches, allocations, syncs) over the
    stage; the names with the most own CPU time. It records the ops of the stage's own thread only, but
    the CUDA runtime calls of every thread (the weight threads' copies and pinned allocations too)."""
    if not enabled:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as profiler:
        yield
    own: dict = {}
    for event in profiler.events():
        seconds, calls = own.get(event.name, (0.0, 0))
        own[event.name] = (seconds + event.self_cpu_time_total / 1e6, calls + 1)
    ranked = sorted(((s, n, name) for name, (s, n) in own.items()), reverse=True)
    log(f"--- {title}: the stage thread's torch ops and every thread's CUDA runtime calls, by own CPU time "
        f"({sum(s for s, _, _ in ranked):.2f} s in all)")
    for seconds, calls, name in ranked[:rows]:
        log(f"    {seconds:7.3f} s  {calls:7d} calls  {name[:100]}")


def table(stage: str, variant: str, total: float, timer: PhaseTimer) -> dict:
    log(f"{stage} ({variant}): {total:.1f} s")
    rows = {}
    for _, _, phase in timer.phases:
        if phase in rows:
            continue
        seconds = timer.seconds.get(phase, 0.0)
        rows[phase] = seconds
        log(f"  {phase:<38} {seconds:7.2f} s {100 * seconds / total:5.1f}%  ({timer.calls.get(phase, 0)} calls)")
    inside = sum(seconds for phase, seconds in rows.items() if not phase.startswith(("[", "open + verify")))
    if IN_LOAD_MODEL in rows:  # the rest of load_model is waiting for the weights thread (and glue)
        rest = rows[IN_LOAD_MODEL] - inside
        rows["load_model rest (waiting for weights, glue)"] = rest
        log(f"  {'load_model rest (waiting for weights)':<38} {rest:7.2f} s {100 * rest / total:5.1f}%")
        other = total - rows[IN_LOAD_MODEL] - rows.get("open + verify core", 0.0)
        label = "other (runtime around load_model)"
    else:
        other, label = total - inside, "other"
    log(f"  {label:<38} {other:7.2f} s {100 * other / total:5.1f}%")
    return {"total_s": total, "phases_s": rows, "other_s": other, "calls": dict(timer.calls)}


def run_variant(checkpoint: Path, scratch: Path, variant: str, args, device: torch.device) -> dict:
    key = SigningKey.generate()
    core = scratch / f"{variant}.core"
    chunks = tuple(int(c) for c in args.chunks.split(",")) if args.chunks else None
    plan = plan_for(args.ttft_prompt, variant == "logprobs", args.smoke, chunks)
    with PhaseTimer(PREPARE_PHASES) as timer, profiled(args.profile, f"prepare ({variant})", args.profile_rows), \
            sampled(args.sample, f"prepare ({variant})", args.profile_rows):
        started = time.perf_counter()

        def progress(line: str) -> None:  # when each program arrives, and its export time in the worker
            log(f"    [{time.perf_counter() - started:5.1f} s] {line}")
        prepare_core(checkpoint, core, key, PrepareOptions(NAMESPACE, dtype=args.dtype, capacities=plan), progress)
        prepared = table("prepare", variant, time.perf_counter() - started, timer)
    prepared["core_gb"] = core.stat().st_size / 1e9
    result = {"prepare": prepared, "load": load(core, key, variant, StartupOptions(), args, device)}
    if variant == "logprobs" and not args.skip_no_logprobs_load:  # the core started with `serve --no-logprobs`
        result["load_skipping_logprobs"] = load(core, key, f"{variant} core, --no-logprobs at load",
                                                StartupOptions(token_logprobs=False), args, device)
    if args.keep_core and variant == args.variants.split(",")[0]:  # for bench/ttft_breakdown.py --core
        args.keep_core.mkdir(parents=True, exist_ok=True)
        core.replace(args.keep_core / "model.core")
        write_key_pair(args.keep_core / "publisher.key", key, [NAMESPACE])
        log(f"kept the {variant} core in {args.keep_core}")
    else:
        core.unlink()
    return result


@contextlib.contextmanager
def triton_compiles(found: dict):
    """Each Triton kernel variant compiled inside: found[kernel name] = [variants, seconds]."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # no Triton: nothing compiles
        yield
        return
    inner = JITFunction._do_compile

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            entry = found.setdefault(getattr(self, "_fn_name", repr(self)), [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - started
    JITFunction._do_compile = timed
    try:
        yield
    finally:
        JITFunction._do_compile = inner


@contextlib.contextmanager
def precompile_reports(reports: list):
    """Each `KernelCompiler.wait` report inside, with its worker count, appended to `reports`."""
    wait = kernel_precompile.KernelCompiler.wait

    def recorded(compiler):
        report = wait(compiler)
        reports.append({"workers": compiler.workers, "longest_first": compiler.longest_first, **report})
        return report
    kernel_precompile.KernelCompiler.wait = recorded
    try:
        yield
    finally:
        kernel_precompile.KernelCompiler.wait = wait


def log_compiles(found: dict) -> None:
    if not found:
        return
    total = sum(seconds for _, seconds in found.values())
    log(f"  Triton compiles: {sum(n for n, _ in found.values())} variants of {len(found)} kernels, {total:.1f} s: "
        + ", ".join(f"{name} x{n} {seconds:.1f} s" for name, (n, seconds)
                    in sorted(found.items(), key=lambda item: -item[1][1])))


def load(core: Path, key: SigningKey, variant: str, startup: StartupOptions, args, device: torch.device) -> dict:
    """Open, verify and load `core` as `build_runtime` does; the phase table; the runtime is closed."""
    compiles: dict = {}
    reports: list = []
    dynamo_before = "torch._dynamo" in sys.modules  # a CUDA load imports none (helios.abi.op_library)
    with PhaseTimer(LOAD_PHASES) as timer, profiled(args.profile, f"load ({variant})", args.profile_rows), \
            sampled(args.sample, f"load ({variant})", args.profile_rows), \
            torch_profiled(args.torch_profile, f"load ({variant})", args.profile_rows), \
            triton_compiles(compiles), precompile_reports(reports):
        started = time.perf_counter()
        opened = open_core(core, accept=NAMESPACE, trusted_keys=[key.public])
        verified = time.perf_counter() - started
        options = RuntimeOptions(load=LoadOptions(startup, device=str(device), cuda_graphs=device.type == "cuda",
                                                  compile_workers=args.compile_workers,
                                                  compile_longest_first=args.compile_order == "longest-first"))
        runtime = build_runtime(opened, options)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timer.seconds["open + verify core"] = verified
        timer.phases = (("", "", "open + verify core"), *timer.phases)
        loaded = table("load", variant, time.perf_counter() - started, timer)
    log_compiles(compiles)
    for report in reports:
        if report["compiles"]:
            log(f"  precompile ({'longest first' if report['longest_first'] else 'in the order sent'}): "
                f"{describe_dispatch(report['compiles'], report['workers'])}")
    if reports:
        loaded["precompile"] = reports[-1]
    loaded["torch._dynamo"] = "imported before" if dynamo_before else \
        "imported by the load" if "torch._dynamo" in sys.modules else "not imported"
    log(f"load ({variant}): torch._dynamo {loaded['torch._dynamo']}")
    loaded["programs"] = len(runtime.model.programs)
    loaded["triton_compiles"] = compiles
    runtime.close()
    del runtime, opened
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return loaded


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--variants", default="logprobs,no-logprobs")
    parser.add_argument("--ttft-prompt", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--chunks", default=None,
                        help="prompt capacities beside the 2,048 prefill, e.g. 128,512 (default 128,256,512)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--medium", action="store_true", help="a 2048-wide model of --layers layers (CPU studies)")
    parser.add_argument("--profile", action="store_true", help="cProfile each stage (adds overhead)")
    parser.add_argument("--sample", action="store_true",
                        help="sample the stage's own thread's stack every 2 ms (wall time, threads apart)")
    parser.add_argument("--staging-mb", type=int, default=None,
                        help="each weight thread's pinned staging buffers, MB (weight_stream.STAGING_SLOT_NBYTES)")
    parser.add_argument("--staging-slots", type=int, default=None,
                        help="pinned staging buffers per weight thread (weight_stream.STAGING_SLOTS)")
    parser.add_argument("--weight-threads", type=int, default=None,
                        help="at most this many threads decode the weights' parts (weight_stream.load_workers; "
                             "default: all CPUs but two, at most 16)")
    parser.add_argument("--torch-profile", action="store_true",
                        help="torch's profiler over each load: the loading thread's ops and every thread's CUDA "
                             "runtime calls by own CPU time (adds overhead)")
    parser.add_argument("--profile-rows", type=int, default=18, help="functions listed per stage")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--skip-no-logprobs-load", action="store_true",
                        help="do not also load the logprobs core with --no-logprobs")
    parser.add_argument("--compile-workers", type=int, default=None,
                        help="worker processes compiling the Triton kernels before capture (LoadOptions."
                             "compile_workers; default: the load's own choice, 0: the warm-up compiles them)")
    parser.add_argument("--compile-order", choices=("longest-first", "sent"), default="longest-first",
                        help="longest-first: a freed compile worker takes the waiting variant expected to compile "
                             "longest; sent: the order the dry run sent them (LoadOptions.compile_longest_first)")
    parser.add_argument("--core", type=Path, default=None,
                        help="load the core --keep-core kept in this folder (no checkpoint, no prepare)")
    parser.add_argument("--keep-core", type=Path, default=None,
                        help="keep the first variant's core (model.core, publisher.key.pub) in this folder")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="the interpreter's thread switch interval in ms (sys.setswitchinterval; default 5); a "
                             "load shortens it to --load-switch-interval while it runs")
    parser.add_argument("--load-switch-interval", type=float, default=None,
                        help="the switch interval a load runs at, in ms (thread_switch.LOAD_SWITCH_INTERVAL; "
                             "default 0.5; 5: the interval Python has, for an A/B)")
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval / 1000)
    if args.load_switch_interval is not None:
        from helios.runtime.loading import thread_switch

        thread_switch.LOAD_SWITCH_INTERVAL = args.load_switch_interval / 1000
    if args.keep_core and any((args.keep_core / name).exists() for name in ("model.core", "publisher.key")):
        parser.error(f"--keep-core {args.keep_core} already holds a core or key (neither is overwritten)")
    from helios.runtime.loading import weight_stream

    if args.staging_mb:
        weight_stream.STAGING_SLOT_NBYTES = args.staging_mb << 20
    if args.staging_slots:
        weight_stream.STAGING_SLOTS = args.staging_slots
    if args.weight_threads:
        chosen = weight_stream.load_workers
        weight_stream.load_workers = lambda resources: min(chosen(resources), args.weight_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    shape = SMOKE if args.smoke else with_layers(MEDIUM if args.medium else LLAMA_31_8B, args.layers)
    if args.smoke:
        args.ttft_prompt = 64
    results = {"layers": shape.num_hidden_layers, "device": str(device), "variants": {}}
    logging.basicConfig(format="%(name)s: %(message)s")  # the capture's precompile report (workers, waiting)
    logging.getLogger("helios.runtime.loading.cuda_graphs").setLevel(logging.INFO)
    if args.core:
        key = load_signing_key(args.core / "publisher.key")
        variant = args.variants.split(",")[0]
        results["variants"][variant] = {"load": load(args.core / "model.core", key, variant, StartupOptions(), args,
                                                     device)}
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        checkpoint = write_random_llama(Path(scratch) / "checkpoint", shape, getattr(torch, args.dtype),
                                        device=device.type)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        log(f"checkpoint: {shape.num_hidden_layers} layers written in {time.perf_counter() - started:.0f} s")
        for variant in args.variants.split(","):
            results["variants"][variant] = run_variant(checkpoint, Path(scratch), variant, args, device)
    compare(results["variants"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def compare(variants: dict) -> None:
    if {"logprobs", "no-logprobs"} <= set(variants):
        with_, without = variants["logprobs"], variants["no-logprobs"]
        for stage in ("prepare", "load"):
            log(f"{stage}: {with_[stage]['total_s']:.1f} s with the logprobs variants, "
                f"{without[stage]['total_s']:.1f} s without ({with_[stage]['total_s'] / without[stage]['total_s']:.2f}x)")
        if "load_skipping_logprobs" in with_:
            log(f"load of the logprobs core with --no-logprobs: {with_['load_skipping_logprobs']['total_s']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
