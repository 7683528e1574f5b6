"""Where a served decode step's time goes between graph replays (used by `bench/anchor_compare.py`).

`step_split(engine, workload, vocab)` serves `workload` under `step_timing.StepTiming`: the device ms
of each full-batch DECODE replay, the device's idle ms before it, and the host's ms per engine step
by phase.

`timeline(engine, workload, vocab, path)` serves it again under the torch profiler (host and device
activity, each engine phase marked), writes the trace (gzipped Chrome JSON) to `path` and returns
`summarize(trace)`: for each graph replay of the most frequent kernel count (the decode step),
its device span, its kernels' busy ms (the span less the gaps between its own kernels), and the gap
after it to the next such replay: what the device ran in that gap (copies, kernels outside graphs)
and which host phases and CUDA runtime calls were under way while it idled.

    python bench/served_timeline.py TRACE.json.gz [--kernels N]   # summarize a trace written by `timeline`

`--kernels N`: also the N kernels that take most of the median decode replay (ms a step, calls).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import statistics
from pathlib import Path

import torch

from gpu_serving import run_helios
from step_timing import StepTiming, Wrappers

PHASES = (("scheduler", "schedule"), ("scheduler", "complete"), ("executor", "launch"), ("executor", "finish"),
          ("engine", "_dispatch"), ("outbox", "flush"))


def step_split(engine, workload, vocab: int, salt: int = 7) -> dict:
    """`workload` served once under `StepTiming` (wrappers removed afterwards); ``served`` holds
    `run_helios`'s result."""
    timing = StepTiming(engine)
    try:
        served = run_helios(engine, workload, vocab, salt=salt)
        summary = timing.summary(workload.requests)
    finally:
        timing.close()
    summary["full_batch_decode_tokens_per_s"] = served["full_batch_decode_tokens_per_s"]
    summary["served"] = served
    summary["line"] = StepTiming.describe(summary)
    return summary


def timeline(engine, workload, vocab: int, path: Path) -> dict:
    """`workload` served under the profiler with each engine phase marked; the trace written to `path`."""
    owners = {"scheduler": engine.scheduler, "executor": engine.executor, "engine": engine, "outbox": engine.outbox}
    wrappers = Wrappers()
    for owner_name, name in PHASES:
        owner = owners[owner_name]
        wrappers.set(owner, name, _marked(getattr(owner, name), f"phase:{name.lstrip('_')}"))
    activities = [torch.profiler.ProfilerActivity.CPU]
    activities += [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    try:
        with torch.profiler.profile(activities=activities) as profile:
            run_helios(engine, workload, vocab, salt=8)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    finally:
        wrappers.restore()
    raw = path.with_suffix("")  # the exporter writes plain JSON
    profile.export_chrome_trace(str(raw))
    with open(raw, "rb") as source, gzip.open(path, "wb") as target:
        target.write(source.read())
    raw.unlink()
    return summarize(_events(path))


def _marked(function, label: str):
    def marked(*args, **kwargs):
        with torch.profiler.record_function(label):
            return function(*args, **kwargs)

    return marked


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as source:
        trace = json.load(source)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def summarize(events: list[dict]) -> dict:
    """Decode replays (the graph launches of the most frequent kernel count) and the gaps between them."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    device = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime = [e for e in spans if e.get("cat") == "cuda_runtime"]
    phases = [e for e in spans if str(e.get("name", "")).startswith("phase:")]
    by_launch = collections.defaultdict(list)
    launches = {e["args"].get("correlation"): e for e in runtime if e.get("name") == "cudaGraphLaunch"}
    for event in device:
        correlation = event.get("args", {}).get("correlation")
        if correlation in launches:
            by_launch[correlation].append(event)
    if not by_launch:
        return {"replays": 0}
    # The most frequent kernel count: the decode step's graph (prefill chunks are fewer launches).
    most = collections.Counter(len(k) for k in by_launch.values()).most_common(1)[0][0]
    full = sorted((sorted(k, key=lambda e: e["ts"]) for k in by_launch.values() if len(k) == most),
                  key=lambda k: k[0]["ts"])
    middle = full[len(full) // 2]
    per_kernel: dict = {}
    for event in middle:
        ms, calls = per_kernel.get(event["name"], (0.0, 0))
        per_kernel[event["name"]] = (ms + event["dur"] / 1e3, calls + 1)
    replays, gaps = [], []
    in_gaps = collections.Counter()
    host_in_gaps = collections.Counter()
    for index, kernels in enumerate(full):
        start, end = kernels[0]["ts"], max(e["ts"] + e["dur"] for e in kernels)
        busy = sum(e["dur"] for e in kernels)
        inner = sum(max(0.0, b["ts"] - (a["ts"] + a["dur"])) for a, b in zip(kernels, kernels[1:]))
        replays.append({"span_ms": (end - start) / 1e3, "busy_ms": busy / 1e3, "inner_gaps_ms": inner / 1e3})
        if index + 1 == len(full):
            break
        following = full[index + 1][0]["ts"]
        gaps.append((following - end) / 1e3)
        for event in device:
            if end <= event["ts"] < following and event.get("args", {}).get("correlation") not in by_launch:
                in_gaps[f"device {event['cat']}: {event['name'][:60]}"] += event["dur"] / 1e3
        for event in runtime + phases:
            overlap = min(following, event["ts"] + event["dur"]) - max(end, event["ts"])
            if overlap > 0:
                host_in_gaps[f"host {event['name'][:60]}"] += overlap / 1e3
    count = max(len(gaps), 1)
    return {
        "replays": len(replays), "kernels": most,
        "span_ms": statistics.median(r["span_ms"] for r in replays),
        "busy_ms": statistics.median(r["busy_ms"] for r in replays),
        "inner_gaps_ms": statistics.median(r["inner_gaps_ms"] for r in replays),
        "gap_after_ms": statistics.median(gaps) if gaps else float("nan"),
        "gap_after_mean_ms": sum(gaps) / count,
        "device_in_gaps_ms": {k: v / count for k, v in in_gaps.most_common(12)},
        "host_in_gaps_ms": {k: v / count for k, v in host_in_gaps.most_common(16)},
        "median_replay_kernels": sorted(([name, ms, calls] for name, (ms, calls) in per_kernel.items()),
                                        key=lambda row: -row[1]),
    }


def describe(summary: dict) -> list[str]:
    if not summary.get("replays"):
        return ["no graph replays found in the trace"]
    lines = [f"{summary['replays']} decode replays of {summary['kernels']} kernels: span {summary['span_ms']:.3f} ms "
             f"(kernels busy {summary['busy_ms']:.3f}, gaps between them {summary['inner_gaps_ms']:.3f}); device idle "
             f"after each until the next {summary['gap_after_ms']:.3f} ms median ({summary['gap_after_mean_ms']:.3f} mean)"]
    lines += [f"  per gap: {name} {ms:.3f} ms" for name, ms in summary["device_in_gaps_ms"].items()]
    lines += [f"  per gap: {name} {ms:.3f} ms" for name, ms in summary["host_in_gaps_ms"].items()]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="a gzipped Chrome trace written by `timeline`")
    parser.add_argument("--kernels", type=int, default=0, help="list the median replay's top kernels")
    args = parser.parse_args(argv)
    summary = summarize(_events(args.trace))
    for line in describe(summary):
        print(line)
    for name, ms, calls in summary.get("median_replay_kernels", [])[:args.kernels]:
        print(f"  median replay: {ms:7.3f} ms {calls:4d}x  {name[:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
