"""What pinned host memory costs to allocate on this machine, and what it does to another thread's CUDA
calls meanwhile: the load's weight threads each allocate a pinned staging ring
(`helios.runtime.loading.weight_stream.StagedCopier`) while the loading thread launches its dry run.

Times one allocation per size; then `--threads` threads each allocating `--slots` buffers of each
size at once (the wall time), while this thread allocates device memory and launches small kernels,
timing the slowest and the mean of those calls against the same calls alone. Fresh sizes each time, so
torch's host cache never serves one.

    python bench/pinned_alloc.py [--threads 14] [--slots 3] [--mode alloc|torch-register|register]

Modes: ``alloc``, torch's pinned allocation (`cudaHostAlloc`); ``torch-register``, torch's
``pinned_use_cuda_host_register`` (malloc, the pages touched on 8 threads, then `cudaHostRegister`);
``register``, ordinary host memory (torch's CPU allocation, page-aligned) registered with one
`cudaHostRegister` per buffer.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

MB = 1 << 20


def pinned(nbytes: int, mode: str) -> torch.Tensor:
    if mode != "register":
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    raw = torch.empty(nbytes + 4096, dtype=torch.uint8)
    offset = -raw.data_ptr() % 4096
    buffer = raw[offset:offset + nbytes]
    cudart = torch.cuda.cudart()
    if cudart.cudaHostRegister(buffer.data_ptr(), nbytes, 0) != cudart.cudaError.success:
        raise SystemExit(f"cudaHostRegister refused {nbytes} bytes")
    return buffer  # kept registered until the process ends


def probe(stop: threading.Event, latencies: list) -> None:
    """Device allocations and launches on this thread until `stop`, each call's seconds in `latencies`."""
    size = 1
    while not stop.is_set():
        started = time.perf_counter()
        block = torch.empty(size * 4096 + 17, dtype=torch.uint8, device="cuda")  # a new size: cudaMalloc at times
        block.zero_()
        latencies.append(time.perf_counter() - started)
        size += 1
        del block


def summary(latencies: list) -> str:
    if not latencies:
        return "no calls"
    return (f"{len(latencies)} calls, mean {1e3 * sum(latencies) / len(latencies):.3f} ms, "
            f"slowest {1e3 * max(latencies):.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=14)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--sizes-mb", default="4,8,32")
    parser.add_argument("--mode", choices=("alloc", "torch-register", "register"), default="alloc")
    args = parser.parse_args()
    if args.mode == "torch-register":
        torch.cuda.memory._set_allocator_settings("pinned_use_cuda_host_register:True,pinned_num_register_threads:8")
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    kept = []
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    print(f"pinned host allocations ({args.mode}):")
    for index, mb in enumerate(sizes):
        started = time.perf_counter()
        kept.append(pinned(mb * MB + (index + 1) * 4096, args.mode))
        seconds = time.perf_counter() - started
        print(f"  one of {mb:4d} MB: {1e3 * seconds:8.1f} ms ({1e3 * seconds / mb:.2f} ms/MB)")
    alone: list = []
    stop = threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    probe(stop, alone)
    print(f"  this thread's device allocations and launches alone: {summary(alone)}")
    for round_, mb in enumerate(sizes):
        def ring(worker: int) -> None:
            for slot in range(args.slots):
                kept.append(pinned(mb * MB + (round_ * 1000 + worker * 10 + slot + 50) * 4096, args.mode))
        latencies: list = []
        stop = threading.Event()
        prober = threading.Thread(target=probe, args=(stop, latencies))
        workers = [threading.Thread(target=ring, args=(w,)) for w in range(args.threads)]
        started = time.perf_counter()
        prober.start()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        wall = time.perf_counter() - started
        stop.set()
        prober.join()
        total = args.threads * args.slots * mb
        print(f"  {args.threads} threads x {args.slots} x {mb} MB ({total} MB): {wall:.2f} s "
              f"({1e3 * wall / total:.2f} ms/MB); another thread's calls meanwhile: {summary(latencies)}")


if __name__ == "__main__":
    main()
