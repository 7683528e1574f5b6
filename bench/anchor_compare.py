"""Helios against the hand-compiled anchor decoder in one device call, the levers A/B, and a profile.

One command on one H200 (about 5-7 minutes at 32 layers):

    python bench/anchor_compare.py --anchor .anchor/compiled_anchor.py --layers 32 --json out.json

1. Writes the random Llama-3.1-8B-shaped bf16 checkpoint (on the GPU), then starts the anchor
   (``python ANCHOR --layers L --batches 1,64,256``: static KV cache, fused weights, torch.compile
   with CUDA graphs) as a subprocess while Helios prepares its core on the host. Helios touches the
   device again only after the anchor has exited (`--serial` runs the anchor before preparing).
   `--tests "ARGS"` first runs pytest on the device (beside the checkpoint writing and preparation;
   the anchor starts after them), so one device call also checks the kernels it measures.
2. Loads the core (CUDA graphs) and runs the same shapes: B requests of 128 prompt tokens and 128
   output tokens, greedy, EOS ignored, for each anchor batch (the ratio takes the steps where all B
   rows decode, as the anchor's fixed batch does; the rate to the last token is printed beside it);
   the 64 x 1024/1024 workload against
   its roofline (every weight plus the live KV once per step at the copy bandwidth measured here);
   time to first token of a 2,048-token prompt, cold and with 90% of it in the prefix cache.
3. Levers A/B in this process (`bench/lever_ab.py`), on the inputs of the long workload's last
   decode step: the loaded DECODE programs captured again (greedy-only and full graphs) with the
   fused sampling pass and with the reference sampling; each fused op against the torch sequence
   it replaced, per decode step; then the profiler's top kernels of one decode step at batch 1 and
   64 beside the captured graph's replay time; and cuBLAS against a Triton GEMV at the batch-1
   projection shapes (`bench/gemv_ab.py`: is a GEMV op worth building?).

Prints one table of Helios/anchor ratios and the targets of issue 18, the A/B rows and the profile;
`--json PATH` writes every number. `--smoke` runs tiny shapes on the CPU (checks the script).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import lever_ab  # noqa: E402
import served_timeline  # noqa: E402
from gc_log import GcLog, describe as describe_gc  # noqa: E402
from gpu_clocks import ClockLog  # noqa: E402
from gpu_serving import NAMESPACE, Workload, copy_bandwidth, log, log_memory, prepare, roofline, run_helios, ttft_rows  # noqa: E402
from random_llama import LLAMA_31_8B, SMOKE, with_layers  # noqa: E402

from helios.abi import gemv_tiles  # noqa: E402
from helios.runtime.loading.defaults import DEFAULT_MEMORY_FRACTION  # noqa: E402
from helios.abi.gemv_tiles import SkinnyTile  # noqa: E402
from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.runtime.loading import gemm_algos, rotary_calls  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402
from helios.server.heap import freeze_startup_heap  # noqa: E402

TESTS_TIMEOUT_S = 150  # the GPU tests delay the anchor; the whole call must fit about 8 minutes
CLOCKS = ClockLog(interval_ms=200)  # SM clock and power per phase of the call (printed at the end)
TARGET_RATIO, TARGET_ROOFLINE, TARGET_COLD_MS, TARGET_CACHED_MS = 1.15, 0.75, 45.0, 12.0


class DeviceQueue:
    """Subprocesses that use the device while this process prepares on the host: the GPU tests
    (if any) at once, then the anchor once the checkpoint is written and the tests have ended, so
    nothing else runs on the device while the anchor measures. Logs are read back afterwards."""

    def __init__(self, anchor: list[str], tests: list[str], scratch: Path):
        self.anchor_command = [sys.executable, *anchor]
        self.tests_command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests] if tests else None
        self.anchor_log, self.tests_log = scratch / "anchor.log", scratch / "tests.log"
        self.checkpoint_written = threading.Event()
        self.anchor: subprocess.Popen | None = None
        self.anchor_started = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        if self.tests_command:
            log(f"tests: {' '.join(self.tests_command[3:])}")
            with open(self.tests_log, "ab") as sink:
                try:
                    subprocess.run(self.tests_command, stdout=sink, stderr=subprocess.STDOUT, timeout=TESTS_TIMEOUT_S,
                                   check=False)
                except subprocess.TimeoutExpired:
                    sink.write(b"\ntests stopped: time limit\n")
        self.checkpoint_written.wait()
        log(f"anchor: {' '.join(self.anchor_command[1:])}")
        self.anchor_started = time.perf_counter()
        with open(self.anchor_log, "wb") as sink:
            self.anchor = subprocess.Popen(self.anchor_command, stdout=sink, stderr=subprocess.STDOUT)

    def wait(self, deadline_s: float) -> dict:
        """The anchor's rows (batch -> row), waiting at most `deadline_s` after its start."""
        self.thread.join()
        if self.tests_command and self.tests_log.exists():
            lines = self.tests_log.read_text(errors="replace").splitlines()
            log("tests: " + " | ".join(line for line in lines[-3:] if line.strip()))
        if self.anchor is None:
            return {}
        try:
            self.anchor.wait(timeout=max(1.0, deadline_s - (time.perf_counter() - self.anchor_started)))
        except subprocess.TimeoutExpired:
            log(f"anchor: still running after {deadline_s:.0f} s; stopped (its finished batches are kept)")
            self.anchor.kill()
            self.anchor.wait()
        log(f"anchor: exit {self.anchor.returncode} after {time.perf_counter() - self.anchor_started:.0f} s")
        rows = {}
        for line in self.anchor_log.read_text(errors="replace").splitlines():
            if line.startswith('{"batch"'):
                row = json.loads(line)
                rows[row["batch"]] = row
            elif "Error" in line or "error:" in line:
                log(f"anchor: {line[:200]}")
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor", type=Path, default=ROOT / ".anchor" / "compiled_anchor.py")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--long", default="64x1024x1024", help="the roofline workload, REQUESTSxPROMPTxOUTPUT")
    parser.add_argument("--ttft-prompt", type=int, default=2048)
    parser.add_argument("--memory-fraction", type=float, default=DEFAULT_MEMORY_FRACTION,
                        help="the load's --memory-fraction (the cache pages' share of the free device memory)")
    parser.add_argument("--anchor-timeout", type=float, default=270.0, help="seconds the anchor may run")
    parser.add_argument("--serial", action="store_true", help="run the anchor before preparing (no overlap)")
    parser.add_argument("--tests", default="", help="pytest arguments (one string) run on the device first, "
                        "while the checkpoint is written and the core prepares (the anchor waits for them)")
    parser.add_argument("--profile-rows", default="1,64")
    parser.add_argument("--short-profile-rows", default="1,64,256",
                        help="decode profiles right after these batch workloads (the anchor's contexts); '' for none")
    parser.add_argument("--top", type=int, default=12, help="kernels listed per profiled step")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--step-timing", default="256",
                        help="batches served again with each replay's device ms, the device's idle ms before it "
                             "and the host's ms by phase (`served_timeline.step_split`); '' for none")
    parser.add_argument("--trace-dir", type=Path, default=None,
                        help="with --step-timing: also serve each batch (32 output tokens) under the profiler and "
                             "write its trace here (`served_timeline.timeline`: what the device and host do between "
                             "full-batch replays)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script)")
    parser.add_argument("--rotary-fusion", choices=("off", "on", "both"), default="on",
                        help="capture with each layer's rotary cache write fused into its attention "
                             "(`rotary_calls.FUSE_AT_CAPTURE`, on when serving); both: the run as served, then "
                             "the batch workloads again on a second load without the fusion (the A/B)")
    parser.add_argument("--fused-prefetch-tokens", type=int, default=0,
                        help="with the fusion: fused calls of at most this many tokens prefetch their output "
                             "projection's weight into L2 (`rotary_calls.PREFETCH_MAX_TOKENS`; 0: none)")
    parser.add_argument("--skinny-table", type=Path, default=None,
                        help="serve with these entries added to `gemv_tiles.SKINNY_TILES` (the JSON that "
                             "`bench/skinny_ab.py --json` writes), and A/B the whole decode step with them")
    parser.add_argument("--gemm-algos", choices=("on", "off"), default="off",
                        help="serve with the projections' cuBLASLt algorithms chosen at load "
                             "(`helios.runtime.loading.gemm_algos`, off when serving) or all on F.linear "
                             "(default: as `helios serve` does)")
    parser.add_argument("--gemm-rows", default=None,
                        help="LO,HI: only projections of LO..HI rows take part in the choice (default 2,256)")
    parser.add_argument("--sustain-ms", type=float, default=0.0,
                        help="time the whole-step A/Bs over back-to-back replays of about this long (the clock a "
                             "long run holds) instead of single replays")
    parser.add_argument("--gemm-sustain-ms", type=float, default=0.0,
                        help="the same for the load-time choice of cuBLASLt algorithms (`gemm_algos.SUSTAIN_MS`)")
    parser.add_argument("--rested-decode", type=float, default=0.0, metavar="SECONDS",
                        help="serve each batch workload again, pausing this long once every request has its first "
                             "token (as the anchor compiles between its prefill and its timed loop, so the device "
                             "starts the loop out of its power cap), and print that decode rate beside the served one")
    parser.add_argument("--freeze-heap", choices=("on", "off"), default="on",
                        help="freeze the process's heap once loaded, as `helios serve` does when ready "
                             "(`helios.server.heap`); off: the first workloads' full collections walk the load's objects")
    parser.add_argument("--first-step-timing", action="store_true",
                        help="serve the first batch workload under the step timing (device ms a replay, idle "
                             "before it, host ms by phase): where a first run after load loses time")
    parser.add_argument("--levers",
                        default="sampling_program_ab,op_ab,profile,gemv_ab,skinny_program_ab,runs_program_ab,pdl_program_ab,"
                                "product_program_ab",
                        help="the lever parts run after the table, comma-separated")
    args = parser.parse_args()
    if args.skinny_table is not None:
        lever_ab.COMMITTED_SKINNY = dict(gemv_tiles.SKINNY_TILES)
        for entry in json.loads(args.skinny_table.read_text()):
            gemv_tiles.SKINNY_TILES[(entry["rows"], entry["out"], entry["in"])] = SkinnyTile.parse(entry["tile"])
        log(f"skinny tiles: {gemv_tiles.SKINNY_TILES}")
    rotary_calls.FUSE_AT_CAPTURE = args.rotary_fusion != "off"
    rotary_calls.PREFETCH_MAX_TOKENS = args.fused_prefetch_tokens
    gemm_algos.ENABLED = args.gemm_algos == "on"
    gemm_algos.SUSTAIN_MS, lever_ab.STEP_SUSTAIN_MS = args.gemm_sustain_ms, args.sustain_ms
    if args.gemm_rows:
        gemm_algos.MIN_ROWS, gemm_algos.MAX_ROWS = (int(v) for v in args.gemm_rows.split(","))
    memory_log = logging.StreamHandler(sys.stdout)  # the pages' sizing beside the capture's measured need
    for name in ("helios.runtime.loading.dry_run_ahead", "helios.runtime.loading.page_sizing"):
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).addHandler(memory_log)
    with CLOCKS:
        compare(args)
    for line in CLOCKS.describe():
        log(line)


def compare(args) -> None:
    smoke = args.smoke
    shape = SMOKE if smoke else with_layers(LLAMA_31_8B, args.layers)
    device = torch.device("cpu" if smoke else "cuda")
    batches = [int(b) for b in ("1,2" if smoke else args.batches).split(",")]
    prompt, output = (16, 16) if smoke else (128, 128)
    workloads = [Workload(b, prompt, output) for b in batches] + [Workload.parse("2x32x32" if smoke else args.long)]
    ttft_prompt = 64 if smoke else args.ttft_prompt
    results: dict = {"layers": shape.num_hidden_layers, "torch": torch.__version__, "workloads": {},
                     "rotary_fusion": args.rotary_fusion}
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name() if not smoke else 'cpu'}, "
        f"{shape.parameters() / 1e9:.2f}B parameters")
    bandwidth = copy_bandwidth(device)
    results["copy_bandwidth_gbs"] = bandwidth / 1e9
    with tempfile.TemporaryDirectory() as scratch:
        anchor_args = [str(args.anchor), "--layers", str(shape.num_hidden_layers), "--batches",
                       ",".join(map(str, batches)), "--prompt", str(prompt), "--steps", str(output)]
        queue = DeviceQueue(anchor_args + (["--smoke"] if smoke else []), shlex.split(args.tests), Path(scratch))
        CLOCKS.phase("anchor and preparation")
        queue.start()
        if args.serial:
            queue.checkpoint_written.set()
            results["anchor"] = queue.wait(args.anchor_timeout)
        key = SigningKey.generate()
        written = []  # when the random checkpoint was written: preparation starts there

        def checkpoint_written():
            written.append(time.perf_counter())
            queue.checkpoint_written.set()

        core = prepare(shape, workloads, Path(scratch), key, "bfloat16", ttft_prompt, device,
                       on_checkpoint=checkpoint_written)
        results["prepare_seconds"] = time.perf_counter() - written[0]  # not the checkpoint's writing
        if not args.serial:
            results["anchor"] = queue.wait(args.anchor_timeout)
        helios_part(core, key, shape, workloads, results, device, bandwidth, ttft_prompt, args)
        if args.rotary_fusion == "both":
            unfused_part(core, key, workloads[:-1], results, device, shape.vocab_size, args.memory_fraction)
    print_levers(results)
    results["clocks"] = CLOCKS.summary()
    save(results, args.json)


def unfused_part(core, key, workloads, results: dict, device, vocab_size: int,
                 memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> None:
    """The batch workloads again on a second load whose captured programs keep each layer's rotary cache
    write and its attention as two launches (`rotary_calls.FUSE_AT_CAPTURE` off); prints both loads'
    rates against the anchor. Never fatal."""
    anchor, base = results.get("anchor", {}), results["workloads"]
    served_fusion = rotary_calls.FUSE_AT_CAPTURE
    rotary_calls.FUSE_AT_CAPTURE = False
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the first load's pools (it is closed)
    try:
        runtime = load_runtime(core, key, workloads, device, memory_fraction)
        try:
            run_helios(runtime.engine, Workload(2, 16, 4), vocab_size, salt=99)  # warm-up
            unfused = {str(w): run_helios(runtime.engine, w, vocab_size) for w in workloads}
        finally:
            runtime.close()
    except Exception as error:  # noqa: BLE001 - the main table is already printed
        log(f"unfused load failed: {type(error).__name__}: {error}")
        return
    finally:
        rotary_calls.FUSE_AT_CAPTURE = served_fusion
    results["rotary_unfused_workloads"] = unfused
    log("")
    log("| decode tok/s, all rows live | compiled anchor | Helios as served (rotary fused at capture) | "
        "Helios, rotary and attention as two launches | served / unfused | unfused / anchor |")
    log("|---|---|---|---|---|---|")
    for workload in workloads:
        theirs = anchor.get(workload.requests, {}).get("decode_tok_s", float("nan"))
        served = base.get(str(workload), {}).get("full_batch_decode_tokens_per_s", float("nan"))
        ours = unfused[str(workload)]["full_batch_decode_tokens_per_s"]
        log(f"| batch {workload.requests} | {theirs:,.1f} | {served:,.1f} | {ours:,.1f} | {served / ours:.3f}x | "
            f"{ours / theirs:.2f}x |")


def save(results: dict, path: Path | None) -> None:
    if path:
        path.write_text(json.dumps(results, indent=1, default=str))


def load_runtime(core, key, workloads, device, memory_fraction: float = DEFAULT_MEMORY_FRACTION):
    """The core loaded as served (CUDA graphs on a GPU), its queue holding the largest workload."""
    options = RuntimeOptions(load=LoadOptions(device=str(device), cuda_graphs=device.type == "cuda",
                                              memory_fraction=memory_fraction),
                             queue_capacity=max(w.requests for w in workloads) + 8)
    return build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options)


def helios_part(core, key, shape, workloads, results: dict, device, bandwidth: float, ttft_prompt: int, args) -> None:
    CLOCKS.phase("helios load")
    started = time.perf_counter()
    runtime = load_runtime(core, key, workloads, device, args.memory_fraction)
    results["load_seconds"] = time.perf_counter() - started
    log(f"loaded in {results['load_seconds']:.0f} s")
    if device.type == "cuda":
        log_memory(device, "after load")
    if args.freeze_heap == "on":
        log(f"heap frozen as `helios serve` does when ready: {freeze_startup_heap():,} objects")
    collections = GcLog()
    choices = gemm_algos.chosen_so_far()
    results["gemm_algos"] = [{"shape": list(c.shape[:3]), "f_linear_us": c.f_linear_us, "chosen_us": c.chosen_us,
                              "label": c.label, "best_us": c.best_us, "best_label": c.best_label} for c in choices]
    for choice in choices:
        log(f"cuBLASLt rows {choice.shape[0]} {choice.shape[1]}x{choice.shape[2]}: F.linear "
            f"{choice.f_linear_us:.2f} us, fastest candidate {choice.best_label} {choice.best_us or 0:.2f} us"
            + (f": chosen ({choice.gain:.3f}x)" if choice.label else ": not chosen"))
    short_profile_rows = {int(r) for r in args.short_profile_rows.split(",") if r}
    try:
        run_helios(runtime.engine, Workload(2, 16, 4), shape.vocab_size, salt=99)  # warm-up
        for index, workload in enumerate(workloads):
            if index == len(workloads) - 1:  # before the long workload, whose last step is a decode step
                results["ttft"] = ttft_rows(runtime.engine, shape.vocab_size, ttft_prompt)
            CLOCKS.phase(f"helios {workload}")
            collections.take()
            if index == 0 and args.first_step_timing and len(workloads) > 1:
                split = served_timeline.step_split(runtime.engine, workload, shape.vocab_size, salt=0)
                log(f"first run, step timing {workload}: {split['line']}")
                ours = split.pop("served")
                results["first_step_timing"] = split
            else:
                ours = run_helios(runtime.engine, workload, shape.vocab_size)
            log(f"helios {workload}: collections while served: {describe_gc(collections.take())}")
            CLOCKS.phase("helios between")
            ours["roofline_tokens_per_s"] = roofline(shape, workload, bandwidth, 2)
            results["workloads"][str(workload)] = ours
            log(f"helios {workload}: decode {ours['full_batch_decode_tokens_per_s']:.1f} tok/s with all rows live, "
                f"{ours['decode_tokens_per_s']:.1f} to the last token ({ours['tokens_per_s']:.1f} overall)")
            if index < len(workloads) - 1 and args.rested_decode > 0:
                rested_run(runtime.engine, workload, shape.vocab_size, results, args.rested_decode)
            if index < len(workloads) - 1 and workload.requests in short_profile_rows:
                short_profile(runtime.model, workload.requests, results, args.top)
                if args.freeze_heap == "on":  # the profiler's objects are the benchmark's, never a server's:
                    # left in the oldest generation, they made a full collection of ~60 ms in the next
                    # (256-row) window (bench/results/session62, and h100_session61); collected, the rest frozen
                    log(f"heap frozen again after the profile: {freeze_startup_heap():,} objects")
        print_summary(results, [w.requests for w in workloads[:-1]], workloads)  # before the levers: kept if
        save(results, args.json)  # the call runs out of time while they run
        CLOCKS.phase("helios step timing")
        step_splits(runtime.engine, shape.vocab_size, workloads[:-1], results, args)
        save(results, args.json)
        CLOCKS.phase("helios levers")
        # The DECODE programs' input buffers now hold a real decode step (one token per row, live
        # page tables): the A/B captures and the profile replay it.
        levers(runtime.model, shape, results, device, args)
    finally:
        collections.close()
        runtime.close()
        del runtime
        gc.collect()


def rested_run(engine, workload, vocab: int, results: dict, rest_s: float) -> None:
    """`workload` served again twice: without a pause (a second run's rate, the control) and with a
    `rest_s` pause after the last first token; their decode rates."""
    CLOCKS.phase(f"helios {workload} again")
    again = run_helios(engine, workload, vocab, salt=8)
    results["workloads"][str(workload)]["again"] = again
    CLOCKS.phase(f"helios {workload} before the pause")
    rested = run_helios(engine, workload, vocab, salt=7, rest_s=rest_s,
                        on_rested=lambda: CLOCKS.phase(f"helios {workload} rested decode"))
    CLOCKS.phase("helios between")
    results["workloads"][str(workload)]["rested"] = rested
    log(f"helios {workload} after a {rest_s:.0f} s pause: decode {rested.get('rested_decode_tokens_per_s', math.nan):.1f} "
        f"tok/s with all rows live ({rested.get('rested_tokens', 0)} tokens), "
        f"{rested['full_batch_decode_tokens_per_s']:.1f} counted from the last first token; served again without "
        f"a pause: {again['full_batch_decode_tokens_per_s']:.1f}")


def step_splits(engine, vocab: int, workloads: list, results: dict, args) -> None:
    """The --step-timing batches served again: device ms per replay, idle before it, host ms by phase;
    with --trace-dir a profiled run of each and a summary of its gaps. Reported, never fatal."""
    wanted = {int(b) for b in args.step_timing.split(",") if b}
    for workload in (w for w in workloads if w.requests in wanted):
        try:
            split = served_timeline.step_split(engine, workload, vocab)
            results.setdefault("step_timing", {})[workload.requests] = split
            log(f"step timing {workload}: {split['full_batch_decode_tokens_per_s']:,.1f} tok/s; {split['line']}")
            if args.trace_dir is None or engine.executor.model.device.type != "cuda":
                continue
            args.trace_dir.mkdir(parents=True, exist_ok=True)
            short = Workload(workload.requests, workload.prompt, 32)
            path = args.trace_dir / f"served_{workload.requests}.json.gz"
            summary = served_timeline.timeline(engine, short, vocab, path)
            results.setdefault("timeline", {})[workload.requests] = summary
            for line in served_timeline.describe(summary):
                log(f"timeline {short}: {line}")
        except Exception as error:  # noqa: BLE001 - the main table is already printed
            log(f"step timing {workload} failed: {type(error).__name__}: {error}")


def short_profile(model, rows: int, results: dict, top: int) -> None:
    """The decode profile right after the workload of `rows` requests: its DECODE program's buffers
    hold one of that workload's last steps (the anchor's 128-256 positions a row), where the levers'
    profile at the end replays the long workload's (2,048). Reported, never fatal."""
    log(f"-- at the anchor's contexts (after the {rows}-request workload):")
    try:
        results.setdefault("short_profile", {})[rows] = lever_ab.decode_profile(model, rows, top, log)
    except Exception as error:  # noqa: BLE001 - the main table must still print
        log(f"short profile R={rows} failed: {type(error).__name__}: {error}")


def levers(model, shape, results: dict, device, args) -> None:
    """The A/B rows and the decode profile; a failure here is reported, never fatal to the table."""
    rows = [int(r) for r in args.profile_rows.split(",")]
    smoke = args.smoke
    parts = (("sampling_program_ab", lambda: lever_ab.sampling_program_ab(model, log)),
             ("op_ab", lambda: lever_ab.op_ab(shape, sorted({1, 64, 256} if not args.smoke else {1, 2}), device, log)),
             ("profile", lambda: [lever_ab.decode_profile(model, r, args.top, log) for r in rows]),
             ("gemv_ab", lambda: _gemv_ab(shape, device)),
             ("skinny_program_ab", lambda: lever_ab.skinny_program_ab(  # the buckets the table names
                 model, {bucket for bucket, _, _ in gemv_tiles.SKINNY_TILES} if not smoke else {2}, log)),
             ("runs_program_ab", lambda: lever_ab.runs_program_ab(model, {1, 64, 256} if not smoke else {1, 2}, log)),
             ("pdl_program_ab", lambda: lever_ab.pdl_program_ab(model, {1, 64, 256} if not smoke else {1, 2}, log)),
             ("lt_program_ab", lambda: lever_ab.lt_program_ab(model, {64, 128, 256} if not smoke else {2}, log)),
             ("product_program_ab", lambda: lever_ab.product_program_ab(model, {1, 64, 256} if not smoke else {1, 2},
                                                                        log)))
    wanted = set(args.levers.split(","))
    for name, part in parts:
        if name not in wanted or (name == "skinny_program_ab" and not gemv_tiles.SKINNY_TILES):
            continue
        try:
            results[name] = part()
        except Exception as error:  # noqa: BLE001 - the main table must still print
            log(f"{name} failed: {type(error).__name__}: {error}")
            results[name] = {"error": f"{type(error).__name__}: {error}"}


def _gemv_ab(shape, device) -> list[dict]:
    if device.type != "cuda":
        return []
    import gemv_ab  # imports triton: CUDA runs only

    return gemv_ab.gemv_ab([1], shape.num_hidden_layers, log)


def print_summary(results: dict, batches: list[int], workloads: list) -> None:
    anchor, rows = results.get("anchor", {}), results["workloads"]
    log("")
    log(f"| decode tok/s, {workloads[0].prompt}-token prompts, greedy | compiled anchor | Helios, all rows live | "
        "Helios / anchor | target | Helios, to the last token | Helios / anchor | "
        "Helios all rows live, timed at each event's callback (the measure before session 42) | Helios / anchor |")
    log("|---|---|---|---|---|---|---|---|---|")
    for batch, workload in zip(batches, workloads):
        row = rows.get(str(workload), {})
        ours = row.get("full_batch_decode_tokens_per_s", float("nan"))
        whole = row.get("decode_tokens_per_s", float("nan"))
        arrived = row.get("full_batch_decode_callback_tokens_per_s", float("nan"))
        theirs = anchor.get(batch, {}).get("decode_tok_s", float("nan"))
        log(f"| batch {batch} | {theirs:,.1f} | {ours:,.1f} | {ours / theirs:.2f}x | {TARGET_RATIO:.2f}x | "
            f"{whole:,.1f} | {whole / theirs:.2f}x | {arrived:,.1f} | {arrived / theirs:.2f}x |")
    rested = [(b, w) for b, w in zip(batches, workloads) if "rested" in rows.get(str(w), {})]
    if rested:
        log("")
        log("| decode tok/s, all rows live | compiled anchor (timed after its compile pause) | Helios, decode right "
            "after the prefill (first run, again) | Helios, after a pause | paused / anchor |")
        log("|---|---|---|---|---|")
        for batch, workload in rested:
            row = rows[str(workload)]
            theirs = anchor.get(batch, {}).get("decode_tok_s", float("nan"))
            paused = row["rested"].get("rested_decode_tokens_per_s", float("nan"))
            log(f"| batch {batch} | {theirs:,.1f} | {row['full_batch_decode_tokens_per_s']:,.1f}, "
                f"{row['again']['full_batch_decode_tokens_per_s']:,.1f} | {paused:,.1f} | "
                f"{paused / theirs:.2f}x |")
    long = rows.get(str(workloads[-1]), {})
    if long:
        share = long["decode_tokens_per_s"] / long["roofline_tokens_per_s"]
        log(f"| {workloads[-1]} decode vs roofline | {long['roofline_tokens_per_s']:,.1f} (roofline) | "
            f"{long['decode_tokens_per_s']:,.1f} | {share:.0%} | {TARGET_ROOFLINE:.0%} |")
    ttft = results.get("ttft")
    if ttft:
        samples = len(ttft.get("cold_samples_s", [0]))
        log(f"| time to first token, {ttft['prompt_tokens']} tokens cold (median of {samples}) | | "
            f"{ttft['cold_s'] * 1e3:.1f} ms | | <= {TARGET_COLD_MS:.0f} ms |")
        log(f"| the same, {ttft['reused_tokens']} tokens cached (median of {samples}) | | "
            f"{ttft['prefix_cached_s'] * 1e3:.1f} ms | | <= {TARGET_CACHED_MS:.0f} ms |")
    log(f"| prepare / load | | {results.get('prepare_seconds', 0):.0f} s / {results.get('load_seconds', 0):.0f} s | | "
        f"<= 45 s / 20 s |")


def print_levers(results: dict) -> None:
    sampling = results.get("sampling_program_ab")
    if isinstance(sampling, list) and sampling:
        log("")
        log("| DECODE step device ms | greedy graph: fused sampling | reference | speedup | "
            "full graph: fused sampling | reference | speedup |")
        log("|---|---|---|---|---|---|---|")
        for row in sampling:
            cells = [f"{row[f'{g}_kernel_ms']:.3f} | {row[f'{g}_reference_ms']:.3f} | "
                     f"{row[f'{g}_reference_ms'] / row[f'{g}_kernel_ms']:.2f}x" for g in ("greedy", "full")]
            log(f"| R={row['rows']} | {cells[0]} | {cells[1]} |")
    ops = results.get("op_ab")
    if isinstance(ops, list) and ops:
        log("")
        log("| fused op, ms per decode step (calls per step) | rows | fused | torch sequence | saved |")
        log("|---|---|---|---|---|")
        for row in ops:
            log(f"| {row['op']} (x{row['calls_per_step']}) | {row['rows']} | {row['fused_ms']:.3f} | "
                f"{row['reference_ms']:.3f} | {row['saved_ms']:.3f} |")
    for profile in results.get("profile", []) if isinstance(results.get("profile"), list) else []:
        if not profile:
            continue
        log("")
        log(f"decode step R={profile['rows']}: {profile['kernels']} kernels, {profile['kernel_ms']:.3f} ms kernel "
            f"time, graph replay {profile['graph_replay_ms']:.3f} ms; by kind: "
            + ", ".join(f"{kind} {ms:.3f} ms" for kind, ms in profile["by_kind_ms"].items()) + "; top kernels:")
        for entry in profile["top"]:
            log(f"  {entry['ms']:8.3f} ms  x{entry['calls']:<4} {entry['kernel']}")


if __name__ == "__main__":
    main()
