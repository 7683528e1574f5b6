"""Verify+decode throughput of a 1 GiB core resource against plain file read + zstd decompression.

    .venv/bin/python bench/core_throughput.py [--gib 1] [--repeat 3] [--dir DIR]

Writes a signed payload core holding one resource of bf16-like weights (normal samples truncated
to bfloat16: realistic compressibility), copies the resource's stored frame verbatim to a plain
`.zst` file, then times in fresh subprocesses, each reading to the end and discarding output:

- helios:   open_core (signature, authorization, contract) + Core.open_resource, streaming; every
            4 MiB chunk SHA-256 checked, frame structure walked, window capped, length enforced;
- baseline: open(.zst) + zstandard stream_reader over the same bytes, nothing checked.

Both files are read once beforehand, so both runs hit a warm page cache. Peak memory is each
child's peak RSS (VmHWM) and its growth over the RSS measured after imports. Not a test.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1024 * 1024
BLOCK = 4 * MiB
REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench.helios/throughput"


class WeightLikeStream(io.RawIOBase):
    """`nbytes` of bfloat16 values drawn from N(0, 0.02), produced 16 MiB at a time."""

    def __init__(self, nbytes: int):
        import numpy

        self._numpy = numpy
        self._random = numpy.random.default_rng(3)
        self._left = nbytes
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if not self._pending and self._left:
            count = min(16 * MiB, self._left) // 2
            values = self._random.normal(0, 0.02, count).astype(self._numpy.float32)
            upper = (values.view(self._numpy.uint32) >> 16).astype("<u2")
            self._pending = memoryview(upper.tobytes())
        count = min(len(buffer), len(self._pending), self._left)
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        self._left -= count
        return count


def _status_bytes(field: str) -> int:
    """A `/proc/self/status` memory field (VmRSS, VmHWM) in bytes. VmHWM is this process's own
    peak RSS since exec (ru_maxrss would carry the forking parent's peak)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(mode: str, directory: Path) -> None:
    """Runs one measurement and prints a JSON line (seconds, decoded bytes, RSS figures)."""
    import zstandard

    from helios.core.keys import TrustedKeys
    from helios.core.reader import open_core

    trusted = TrustedKeys.from_paths([directory / "bench.key.pub"])
    buffer = bytearray(BLOCK)
    rss_before = _status_bytes("VmRSS")
    start = time.perf_counter()
    total = 0
    if mode == "helios":
        core = open_core(directory / "bench.core", accept=NAMESPACE, trusted_keys=trusted)
        stream = core.open_resource("weights")
    else:
        stream = zstandard.ZstdDecompressor().stream_reader(open(directory / "frame.zst", "rb"))
    with stream:
        while count := stream.readinto(buffer):
            total += count
    seconds = time.perf_counter() - start
    peak = _status_bytes("VmHWM")
    result = {"seconds": seconds, "decoded": total, "rss_before": rss_before, "peak": peak}
    print(json.dumps(result))


def prepare(directory: Path, nbytes: int) -> dict:
    from helios.contract import PreparedContract, manifest_pb2
    from helios.core.keys import SigningKey, write_key_pair
    from helios.core.reader import load_unverified
    from helios.core.records import ResourceKind
    from helios.core.writer import CoreWriter

    key = SigningKey.generate()
    write_key_pair(directory / "bench.key", key)
    prepared = PreparedContract.from_json((REPO / "examples" / "contract.json").read_text())
    writer = CoreWriter()
    writer.set_contract(prepared)
    writer.set_publisher(NAMESPACE)
    manifest = manifest_pb2.ExecutionManifest.FromString(prepared.encode()[1])
    for rid in {b.resource_id for b in manifest.buffers if b.resource_id}:
        writer.add_resource(rid, ResourceKind.WEIGHTS, b"\x00" * 64, rank=0)
    for handle in manifest.graph_handles:
        writer.add_resource(handle.resource_id, ResourceKind.PROGRAM, b"program", rank=handle.rank)
    source = io.BufferedReader(WeightLikeStream(nbytes), 16 * MiB)
    writer.add_resource("weights", ResourceKind.WEIGHTS, source, rank=0)
    writer.add_signing_key(key)
    start = time.perf_counter()
    writer.write(directory / "bench.core")
    write_seconds = time.perf_counter() - start
    placement = load_unverified(directory / "bench.core").placements["weights"]
    frame = directory / "frame.zst"
    with open(directory / "bench.core", "rb") as source, open(frame, "wb") as sink:
        source.seek(placement.offset)
        left = placement.nbytes
        while left:
            data = source.read(min(BLOCK, left))
            sink.write(data)
            left -= len(data)
    return {"write_seconds": write_seconds, "stored": placement.nbytes}


def warm(path: Path) -> None:
    with open(path, "rb") as handle:
        while handle.read(16 * MiB):
            pass


def measure(mode: str, directory: Path, repeat: int) -> list[dict]:
    runs = []
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--dir", str(directory)],
            capture_output=True, text=True, check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def report(name: str, runs: list[dict]) -> float:
    best = min(r["seconds"] for r in runs)
    median = statistics.median(r["seconds"] for r in runs)
    decoded = runs[0]["decoded"]
    peak = max(r["peak"] for r in runs) / MiB
    growth = max(r["peak"] - r["rss_before"] for r in runs) / MiB
    print(f"{name:9s} best {best:6.3f} s ({decoded / best / 2**30:5.2f} GiB/s decoded)  "
          f"median {median:6.3f} s  peak RSS {peak:6.1f} MiB (+{growth:5.1f} MiB over idle)")
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="decoded resource size in GiB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", help="work directory (default: a new temporary directory)")
    parser.add_argument("--child", choices=["helios", "baseline"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, Path(args.dir))
        return 0
    directory = Path(args.dir or tempfile.mkdtemp(prefix="helios-bench-"))
    nbytes = int(args.gib * 2**30)
    facts = prepare(directory, nbytes)
    print(f"resource: {nbytes / 2**30:.2f} GiB decoded, {facts['stored'] / 2**30:.3f} GiB stored "
          f"(ratio {nbytes / facts['stored']:.2f}); generate+compress+write "
          f"{facts['write_seconds']:.2f} s")
    warm(directory / "bench.core")
    warm(directory / "frame.zst")
    helios = report("helios", measure("helios", directory, args.repeat))
    baseline = report("baseline", measure("baseline", directory, args.repeat))
    print(f"helios verify+decode takes {helios / baseline:.2f}x the time of plain read + zstd")
    if not args.dir:
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
