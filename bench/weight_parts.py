"""Weights load from one resource against the same weights cut into parts, in one process.

    python bench/weight_parts.py [--mb 1024] [--part-mb 128] [--workers N] [--device cpu|cuda] [--repeat 2]

Random bf16 tensors (8192 x 2048 each, about `--mb` MB in all) are stored as one zstd frame with
chunk digests (as `helios.core.writer` stores a weights resource), and again as parts of about
`--part-mb` MB (`helios.ignition.sharding.weight_parts`). Each is loaded with
`helios.runtime.loading.weight_stream.load_weight_resources` (verify, decode, copy), alternating so that
load on a shared machine affects both alike; prints MB/s of decoded bytes and the ratio parts / one.
The tensors are checked equal. Not a test.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from helios.core.chunks import RangeFile, VerifiedChunks
from helios.core.frame_reader import FrameReader
from helios.core.payload_encode import store_resource
from helios.core.records import ResourceKind
from helios.core.streams import STREAM_BUFFER_NBYTES
from helios.ignition.safetensors_image import safetensors_image
from helios.ignition.sharding import weight_parts
from helios.runtime.loading.weight_stream import WantedTensor, load_weight_resources, load_workers


def store(folder: Path, name: str, tensors: dict) -> tuple[Path, object, int]:
    image = safetensors_image(tensors)
    path = folder / f"{name}.zst"
    with open(path, "wb") as sink:
        entry = store_resource(image.segments, sink, size=None, resource_id=name, kind=ResourceKind.WEIGHTS,
                               rank=0, aes_key=None, nonce_prefix=b"")
    return path, entry, image.nbytes


def opener(stored: dict):
    def open_resource(resource_id: str):
        path, entry, nbytes = stored[resource_id]
        source = RangeFile.open(path, 0, path.stat().st_size)
        chunks = VerifiedChunks(source, entry.chunk_sha256, resource_id, entry.chunk_nbytes)
        return io.BufferedReader(FrameReader(chunks, nbytes, on_close=source.close), STREAM_BUFFER_NBYTES)
    return open_resource


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--part-mb", type=int, default=128)
    parser.add_argument("--workers", type=int, default=None, help="default: load_workers(parts)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    count = max(1, args.mb * 2**20 // (8192 * 2048 * 2))
    tensors = {f"w.{i:03d}": (torch.randn(8192, 2048) * 0.02).to(torch.bfloat16) for i in range(count)}
    wanted = {name: WantedTensor(t.dtype, tuple(t.shape)) for name, t in tensors.items()}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        whole = {"one": store(folder, "one", tensors)}
        parts = {f"part{k}": store(folder, f"part{k}", part)
                 for k, part in enumerate(weight_parts(tensors, args.part_mb * 2**20))}
        workers = args.workers or load_workers(len(parts))
        print(f"{sum(t.numel() * 2 for t in tensors.values()) / 1e6:.0f} MB in {len(parts)} parts, {workers} workers")
        cases = {"one resource": (whole, 1), f"{len(parts)} parts": (parts, workers)}
        seconds = {label: [] for label in cases}
        for _ in range(args.repeat):
            for label, (stored, threads) in cases.items():
                names = {r: (s[2], {n: wanted[n] for n in wanted if n in _names(stored, r, tensors, args)})
                         for r, s in stored.items()}
                started = time.perf_counter()
                loaded = load_weight_resources(opener(stored), names, device, workers=threads)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds[label].append(time.perf_counter() - started)
                assert all(torch.equal(loaded[n].cpu(), tensors[n]) for n in tensors)
        nbytes = sum(t.numel() * 2 for t in tensors.values())
        best = {label: statistics.median(times) for label, times in seconds.items()}
        for label, value in best.items():
            print(f"  {label:<14} {value:6.2f} s  {nbytes / value / 1e6:7.0f} MB/s")
        one, many = best["one resource"], best[f"{len(parts)} parts"]
        print(f"parts / one resource: {one / many:.2f}x faster")
    return 0


def _names(stored: dict, resource_id: str, tensors: dict, args) -> set[str]:
    if resource_id == "one":
        return set(tensors)
    return set(weight_parts(tensors, args.part_mb * 2**20)[int(resource_id[4:])])


if __name__ == "__main__":
    sys.exit(main())
