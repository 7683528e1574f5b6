"""Core I/O throughput: the weights' load and prepare paths before and after, in one process.

    .venv/bin/python bench/core_io.py [--layers 1] [--repeat 2] [--device cpu] [--sink null|file] [--dir DIR]

Writes a random Llama-8B-shaped checkpoint (`--layers` decoder layers; 1 layer is about 2.5 GB of
bf16) and prepares it with `prepare_core` (small capacities; timed once), then times, alternating
so that load on a shared machine affects both alike:

- load, before: `read_resource` (the whole decoded resource as bytes) + `safetensors.load` + `.to`;
- load, after: `_load_weights` (tensors filled straight from the verified stream; staged for CUDA);
- verify, 0 vs 2 chunks of read-ahead: the weights resource drained, hashing on the caller's thread
  or on the chunk pool;
- prepare weights, before: `safetensors.save` bytes, a digest of them, `copy_stream` with every
  chunk digest on the writing thread; after: the safetensors image compressed from the tensors,
  chunk digests on the pool, the file digest on a background thread.

MB/s are per stored (compressed) byte; ratios are after / before. Not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import tempfile
import time
from pathlib import Path

import torch
import zstandard
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_llama import LLAMA_31_8B, with_layers, write_random_llama  # noqa: E402

from helios.core import chunks  # noqa: E402
from helios.core.chunks import ChunkDigester  # noqa: E402
from helios.core.frame_writer import ZSTD_LEVEL, write_frame  # noqa: E402
from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.core.streams import drain_decoded  # noqa: E402
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core  # noqa: E402
from helios.ignition.recipes import load_checkpoint  # noqa: E402
from helios.ignition.safetensors_image import digest_in_background, safetensors_image  # noqa: E402
from helios.runtime.loading import model as runtime_model  # noqa: E402

NAMESPACE = "bench.helios/core-io"


class _NullSink:
    def write(self, data) -> int:
        return len(data)


class _SerialDigestSink:
    """The writer's sink before: every chunk digest computed on the writing thread."""

    def __init__(self, sink):
        self._sink, self.digester = sink, ChunkDigester()

    def write(self, data) -> int:
        self.digester.update(data)
        return self._sink.write(data)


def _timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def load_before(core, device: torch.device) -> None:
    resource_id = next(info.id for info in core.resources if info.kind.name == "WEIGHTS")
    tensors = load_safetensors(core.read_resource(resource_id))
    {name: tensor.to(device) for name, tensor in tensors.items()}


def load_after(core, device: torch.device) -> None:
    runtime_model._load_weights(core, core.prepared, device, 0)


def verify_with(core, read_ahead: int) -> None:
    resource_id = next(info.id for info in core.resources if info.kind.name == "WEIGHTS")
    defaults = chunks.VerifiedChunks.__init__.__kwdefaults__
    saved, defaults["read_ahead"] = defaults["read_ahead"], read_ahead
    try:
        with core.open_resource(resource_id) as stream:
            drain_decoded(stream)
    finally:
        defaults["read_ahead"] = saved


def prepare_before(tensors, sink_factory) -> None:
    data = save_safetensors(tensors)
    hashlib.sha256(data).digest()
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True, write_content_size=True, threads=-1)
    sink = _SerialDigestSink(sink_factory())
    compressor.copy_stream(io.BytesIO(data), sink, size=len(data), read_size=1 << 20, write_size=1 << 20)
    sink.digester.finish()


def prepare_after(tensors, sink_factory) -> None:
    image = safetensors_image(tensors)
    digest = digest_in_background(image)
    write_frame(image.segments, sink_factory())
    digest.result()


def _report(name: str, stored_nbytes: int, before: list[float], after: list[float], labels=("before", "after")) -> None:
    best_before, best_after = min(before), min(after)
    print(f"{name}: {labels[0]} {stored_nbytes / 1e6 / best_before:.0f} MB/s ({best_before:.2f} s), "
          f"{labels[1]} {stored_nbytes / 1e6 / best_after:.0f} MB/s ({best_after:.2f} s), "
          f"ratio {best_before / best_after:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sink", default="null", choices=("null", "file"), help="prepare rows: discard or write a file")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        scratch = Path(scratch)
        checkpoint = write_random_llama(scratch / "checkpoint", with_layers(LLAMA_31_8B, args.layers))
        key = SigningKey.generate()
        plan = CapacityPlan(page_tokens=16, context_tokens=64, prefill_tokens=16, decode_batches=(1,), mixed=False)
        path = scratch / "model.core"
        seconds = _timed(lambda: prepare_core(checkpoint, path, key, PrepareOptions(NAMESPACE, dtype="bfloat16",
                                                                                     capacities=plan)))
        print(f"prepare_core: {path.stat().st_size / 1e6 / seconds:.0f} MB/s stored ({seconds:.1f} s, "
              f"{path.stat().st_size / 1e9:.2f} GB, programs and checkpoint reading included)", flush=True)
        core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public])
        stored = next(info.stored_nbytes for info in core.resources if info.kind.name == "WEIGHTS")
        rows = {"load weights": ([], []), "verify weights (read-ahead 0 vs 2)": ([], []), "prepare weights": ([], [])}
        tensors = {f"w.{w.name}": w.tensor.contiguous() for w in load_checkpoint(checkpoint, "bfloat16").weights}
        sink_path = scratch / "sink.bin"
        sink_factory = _NullSink if args.sink == "null" else lambda: open(sink_path, "wb", buffering=1 << 20)
        for _ in range(args.repeat):
            rows["load weights"][0].append(_timed(lambda: load_before(core, device)))
            rows["load weights"][1].append(_timed(lambda: load_after(core, device)))
            rows["verify weights (read-ahead 0 vs 2)"][0].append(_timed(lambda: verify_with(core, 0)))
            rows["verify weights (read-ahead 0 vs 2)"][1].append(_timed(lambda: verify_with(core, 2)))
            rows["prepare weights"][0].append(_timed(lambda: prepare_before(tensors, sink_factory)))
            rows["prepare weights"][1].append(_timed(lambda: prepare_after(tensors, sink_factory)))
        for name, (before, after) in rows.items():
            _report(name, stored, before, after)


if __name__ == "__main__":
    main()
