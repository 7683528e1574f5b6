"""Where an 8B-shaped core's load puts its device memory: what the pages take, what the CUDA graph
capture holds beside them, and, where the capture runs out of memory, what is live at that moment.

Prepares the Llama-3.1-8B-shaped random core as bench/gpu_serving.py does, records the allocator's
history (Python stacks) while it loads with `--memory-fraction` (default the load's), and prints
the live allocations at the end of the load, and the first time a load runs out of device memory
(a capture that does is retried at a lower fraction, `helios.runtime.loading.model`), summed by the
first Helios frame that allocated them, graph pools apart. Run on a CUDA device from the repository root:
    PYTHONPATH=src:bench python3 bench/load_memory.py [--layers 32] [--memory-fraction 0.85]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_serving import NAMESPACE, Workload, log, log_memory, prepare  # noqa: E402
from random_llama import LLAMA_31_8B, with_layers  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.runtime.loading import model as loading_model  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.loading.defaults import DEFAULT_MEMORY_FRACTION  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402

GIB = 2**30


def traced(name: str, device):
    """Wraps `loading_model.<name>` to log the memory before and after it."""
    inner = getattr(loading_model, name)

    def wrapper(*args, **kwargs):
        log_memory(device, f"before {name}")
        torch.cuda.reset_peak_memory_stats(device)
        result = inner(*args, **kwargs)
        log_memory(device, f"after {name}" + (f" ({result} pages)" if isinstance(result, int) else ""))
        return result

    setattr(loading_model, name, wrapper)


def site(frames: list) -> str:
    """The allocating frame: the first in Helios (innermost first), with the torch frame below it."""
    for index, frame in enumerate(frames):
        name = frame.get("filename", "")
        if "/helios/" in name:
            below = frames[index - 1] if index else {}
            return (f"{name.split('/helios/')[-1]}:{frame.get('line')} {frame.get('name')}"
                    f" <- {below.get('filename', '').split('/')[-1]}:{below.get('name', '')}")
    return "(no Helios frame) " + " | ".join(f"{f.get('filename', '').split('/')[-1]}:{f.get('name')}" for f in frames[:3])


def live_summary(top: int) -> None:
    snapshot = torch.cuda.memory._snapshot()
    by_site = collections.Counter()
    pools = collections.Counter()
    for segment in snapshot["segments"]:
        pool = "graph pool" if tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0) else "general"
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            pools[pool] += block["size"]
            by_site[(pool, site(block.get("frames", [])))] += block["size"]
    for pool, size in pools.items():
        log(f"live in {pool}: {size / GIB:.2f} GiB")
    for (pool, where), size in by_site.most_common(top):
        log(f"  {size / GIB:8.3f} GiB  {pool:10s} {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--memory-fraction", default=str(DEFAULT_MEMORY_FRACTION),
                        help="comma-separated: one load after another, each summarised")
    parser.add_argument("--top", type=int, default=30, help="allocation sites listed")
    parser.add_argument("--device-gib", type=float, default=None,
                        help="hold the device's memory beyond this many GiB first (an H200 loading as an 80 GB H100 would)")
    args = parser.parse_args()
    device = torch.device("cuda")
    shape = with_layers(LLAMA_31_8B, args.layers)
    workloads = [Workload(b, 128, 128) for b in (1, 64, 256)] + [Workload.parse("16x128x128")]
    with tempfile.TemporaryDirectory() as scratch:
        key = SigningKey.generate()
        core = prepare(shape, workloads, Path(scratch), key, "bfloat16", 2048, device)
        _, total = torch.cuda.mem_get_info(device)
        ballast = None
        if args.device_gib is not None and total > args.device_gib * GIB:
            ballast = torch.empty(int(total - args.device_gib * GIB), dtype=torch.uint8, device=device)
            log(f"holding {ballast.numel() / GIB:.2f} GiB: the load sees a {args.device_gib:.2f} GiB device")
        for name in ("default_pages", "capture_programs", "choose_gemm_algorithms"):
            traced(name, device)
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
        summarised = []

        def out_of_memory(device_index, size, allocated, free):  # what is live the moment it runs out
            if not summarised:
                summarised.append(True)
                log(f"out of memory allocating {size / 2**20:.0f} MiB ({allocated / GIB:.2f} GiB allocated, "
                    f"{free / GIB:.2f} GiB free)")
                live_summary(args.top)

        torch._C._cuda_attach_out_of_memory_observer(out_of_memory)
        for fraction in (float(f) for f in args.memory_fraction.split(",")):
            summarised.clear()
            log(f"== load with --memory-fraction {fraction}")
            load(core, key, fraction, device, args.top)


def load(core, key, fraction: float, device, top: int) -> None:
    options = RuntimeOptions(load=LoadOptions(device="cuda", cuda_graphs=True, memory_fraction=fraction),
                             queue_capacity=264)
    started = time.perf_counter()
    try:
        runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options)
    except Exception as error:  # noqa: BLE001 - what was live when it failed is the point
        log(f"load failed after {time.perf_counter() - started:.0f} s: {type(error).__name__}: {error}")
        del error
        torch.cuda.empty_cache()
        log_memory(device, "after the failure")
        return
    log(f"loaded in {time.perf_counter() - started:.0f} s")
    log_memory(device, "loaded")
    live_summary(top)
    runtime.close()
    del runtime
    torch.cuda.empty_cache()
    log_memory(device, "closed")


if __name__ == "__main__":
    main()
