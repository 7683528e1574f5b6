"""Decode at the compiled anchor's shapes: the greedy graphs with and without the sampling rewrite,
where each served step's host time goes, how long the device waits between steps, and the anchor.

One device call on one H200 (about 3 minutes at 8 layers):

    python bench/decode_host_ab.py --layers 8 --anchor .anchor/compiled_anchor.py [--json out.json]

1. Writes the random Llama-3.1-8B-shaped bf16 checkpoint (`--layers` deep) on the GPU, runs
   `--tests` (pytest arguments) and then the anchor (`python ANCHOR --layers L`) as subprocesses
   on the device while Helios prepares on the host (its capacity plan is anchor_compare's:
   2,048 prefill tokens). Helios touches the device only once they have exited.
2. Loads the core with CUDA graphs; its greedy graphs are the rewritten ones
   (`helios.runtime.loading.sampling_rewrite`: counts read through the slots, padding rows skipped,
   the bias added in place). The same programs' greedy graphs as before that rewrite (the bound
   GREEDY variant only) are captured beside them, and each workload (B requests, 128 prompt and
   128 output tokens, greedy, EOS ignored) is served `--rounds` times with each set, alternating.
3. Every served program launch is timed: CUDA events around the graph replay give the device ms
   of each step and the device's idle ms before it (the gap after the previous step: host work the
   second execution frame did not hide); host wall ms per engine step is split into the wait for
   the device and the host's own work, by phase (schedule, launch, finish, complete, events).

Prints, per batch: decode tok/s of both graph sets and their ratio, Helios/anchor for each, and
the step table (device ms of full steps, idle ms per step, host ms per step by phase).
`--smoke` runs tiny shapes on the CPU (checks the script; no graphs, no events).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_serving import NAMESPACE, Workload, log, prepare, run_helios  # noqa: E402
from random_llama import LLAMA_31_8B, SMOKE, with_layers  # noqa: E402
from step_timing import StepTiming, legacy_greedy_graphs  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

TARGET = 1.15


class DeviceJobs:
    """The tests, then the anchor, as subprocesses on the device while this process prepares."""

    def __init__(self, tests: list[str], anchor: list[str] | None, tests_timeout: float, scratch: Path,
                 tests_log: Path | None = None):
        self.tests, self.anchor, self.tests_timeout = tests, anchor, tests_timeout
        self.tests_log = tests_log or scratch / "tests.log"
        self.anchor_log = scratch / "anchor.log"
        self.checkpoint_written = threading.Event()
        self.process: subprocess.Popen | None = None
        self.started = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.tests:
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *self.tests]
            log(f"tests: {' '.join(command[3:])}")
            with open(self.tests_log, "wb") as sink:
                tests = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    tests.wait(timeout=self.tests_timeout)
                except subprocess.TimeoutExpired:  # its whole group: pytest-xdist workers must not run on
                    _stop(tests)
                    sink.write(f"\ntests stopped after {self.tests_timeout:.0f} s\n".encode())
            lines = self.tests_log.read_text(errors="replace").splitlines()
            log("tests: " + " | ".join(line for line in lines[-3:] if line.strip()))
        self.checkpoint_written.wait()
        if self.anchor:
            log(f"anchor: {' '.join(self.anchor)}")
            self.started = time.perf_counter()
            with open(self.anchor_log, "wb") as sink:
                self.process = subprocess.Popen([sys.executable, *self.anchor], stdout=sink, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def wait(self, deadline: float) -> dict:
        """The anchor's rows by batch, stopping it at `deadline` (perf_counter seconds)."""
        self.thread.join()
        if self.process is None:
            return {}
        try:
            self.process.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            log("anchor: stopped at its deadline (finished batches are kept)")
            _stop(self.process)  # with its compile workers
        log(f"anchor: exit {self.process.returncode} after {time.perf_counter() - self.started:.0f} s")
        rows = {}
        for line in self.anchor_log.read_text(errors="replace").splitlines():
            if line.startswith('{"batch"'):
                row = json.loads(line)
                rows[row["batch"]] = row
        return rows


def _stop(process: subprocess.Popen) -> None:
    """Kills `process` and every process of its session (it was started with a session of its own)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batches", default="256,64,1")
    parser.add_argument("--output", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each graph set per batch")
    parser.add_argument("--anchor", type=Path, default=None)
    parser.add_argument("--anchor-seconds", type=float, default=110.0, help="the anchor's deadline from start")
    parser.add_argument("--anchor-reference", default="",
                        help="BATCH:TOK_S,... the anchor's decode tok/s from another call (without --anchor)")
    parser.add_argument("--tests", default="", help="pytest arguments run on the device first")
    parser.add_argument("--tests-timeout", type=float, default=45.0)
    parser.add_argument("--tests-log", type=Path, help="where the tests' output goes (default: a scratch file)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    began = time.perf_counter()
    shape = SMOKE if args.smoke else with_layers(LLAMA_31_8B, args.layers)
    device = torch.device("cpu" if args.smoke else "cuda")
    batches = [2, 1] if args.smoke else [int(b) for b in args.batches.split(",")]
    prompt, output = (16, 16) if args.smoke else (128, args.output)
    workloads = [Workload(b, prompt, output) for b in batches]
    results: dict = {"layers": shape.num_hidden_layers, "batches": {}}
    with tempfile.TemporaryDirectory() as scratch:
        anchor = None
        if args.anchor is not None:
            anchor = [str(args.anchor), "--layers", str(shape.num_hidden_layers), "--batches", ",".join(map(str, batches)),
                      "--prompt", str(prompt), "--steps", str(output)] + (["--smoke"] if args.smoke else [])
        jobs = DeviceJobs(args.tests.split(), anchor, args.tests_timeout, Path(scratch), args.tests_log)
        key = SigningKey.generate()
        core = prepare(shape, workloads, Path(scratch), key, "bfloat16", 64 if args.smoke else 2048, device,
                       on_checkpoint=jobs.checkpoint_written.set)
        jobs.checkpoint_written.set()
        results["anchor"] = jobs.wait(began + args.anchor_seconds)
        for item in filter(None, args.anchor_reference.split(",")):  # measured in another call
            batch, rate = item.split(":")
            results["anchor"].setdefault(int(batch), {"decode_tok_s": float(rate), "another_call": True})
        serve(core, key, shape.vocab_size, workloads, device, args.rounds, results)
    summary(results, batches)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


def serve(core, key, vocab: int, workloads: list[Workload], device, rounds: int, results: dict) -> None:
    started = time.perf_counter()
    options = RuntimeOptions(load=LoadOptions(device=str(device), cuda_graphs=device.type == "cuda"),
                             queue_capacity=max(w.requests for w in workloads) + 8)
    runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options)
    log(f"loaded in {time.perf_counter() - started:.0f} s")
    try:
        graphs = legacy_greedy_graphs(runtime.model) if device.type == "cuda" else None
        timing = StepTiming(runtime.engine)
        run_helios(runtime.engine, Workload(2, 16, 4), vocab, salt=99)  # warm-up
        for workload in workloads:
            rows = results["batches"][workload.requests] = {"new": [], "old": [], "steps": {}}
            for round_index in range(rounds):
                for name in ("new", "old") if graphs is not None else ("new",):
                    if graphs is not None:
                        graphs.use(name == "old")
                    timing.reset()
                    served = run_helios(runtime.engine, workload, vocab, salt=round_index)
                    rows[name].append(served["decode_tokens_per_s"])
                    rows["steps"].setdefault(name, []).append(timing.summary(workload.requests))
                    log(f"{name} graphs {workload} round {round_index}: decode {served['decode_tokens_per_s']:,.1f} "
                        f"tok/s; {timing.line(workload.requests)}")
        if graphs is not None:
            graphs.use(False)
            frames, runtime.engine.frames = runtime.engine.frames, 1
            for workload in workloads:
                timing.reset()
                served = run_helios(runtime.engine, workload, vocab, salt=9)
                results["batches"][workload.requests]["one_frame"] = served["decode_tokens_per_s"]
                log(f"one frame {workload}: decode {served['decode_tokens_per_s']:,.1f} tok/s; "
                    f"{timing.line(workload.requests)}")
            runtime.engine.frames = frames
    finally:
        runtime.close()


def summary(results: dict, batches: list[int]) -> None:
    anchor = results.get("anchor", {})
    log("")
    log(f"SUMMARY {results['layers']} layers | batch | anchor tok/s | Helios new | Helios old (before the rewrite) "
        f"| new/old | new/anchor | old/anchor | one frame (new) |")
    for batch in batches:
        row = results["batches"].get(batch)
        if not row:
            continue
        new = statistics.median(row["new"])
        old = statistics.median(row["old"]) if row["old"] else float("nan")
        theirs = anchor.get(batch, {}).get("decode_tok_s", float("nan"))
        where = " (another call)" if anchor.get(batch, {}).get("another_call") else ""
        log(f"SUMMARY | {batch} | {theirs:,.1f}{where} | {new:,.1f} | {old:,.1f} | {new / old:.3f}x | {new / theirs:.3f}x "
            f"(target {TARGET}) | {old / theirs:.3f}x | {row.get('one_frame', float('nan')):,.1f} |")
        for name, steps in row["steps"].items():
            log(f"STEPS {name} batch {batch}: " + " ; ".join(StepTiming.describe(s) for s in steps))


if __name__ == "__main__":
    main()
