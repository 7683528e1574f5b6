"""Program load time: program images (graph JSON + safetensors, what cores store) against
torch.export.save archives (what they stored before, unpickled on load), same programs, same process.

Exports every program variant that preparation captures for a checkpoint (the embedded default
model by default, with the embedded core's capacities), stores each both ways and times building a
callable module from each storage, interleaved, best of --repeats: for images `read_program_image`
(protobuf, JSON, the graph check, safetensors) + `deserialize_program` + ``.module()``, which is
what `helios.runtime.loading.model` does; for archives ``torch.export.load`` + ``.module()``. Prints the
per-variant and total times and sizes and the image/archive ratio (below 1: images load faster).

    python bench/program_load.py                                   # the embedded default model
    python bench/program_load.py --checkpoint DIR --decode-batches 1,4,16 --context-tokens 2048
    python bench/program_load.py --fixture                         # the tiny Qwen3 test model's shapes
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

import helios.abi  # noqa: E402,F401  (registers the ABI ops)
from helios.abi.program_image import deserialize_program, encode_program, read_program_image  # noqa: E402
from helios.ignition.capture import export_program  # noqa: E402
from helios.ignition.export import CapacityPlan  # noqa: E402
from helios.ignition.program_spec import ProgramOptions  # noqa: E402
from helios.ignition.recipes import load_checkpoint  # noqa: E402


def main() -> int:
    args = _arguments()
    checkpoint, plan = _checkpoint_and_plan(args)
    arch = load_checkpoint(checkpoint).architecture
    options = dataclasses.replace(ProgramOptions(), attention_tuning=plan.attention_tuning,
                                  device_pending=plan.device_pending)
    rows, totals = [], {"image_s": 0.0, "archive_s": 0.0, "image_bytes": 0, "archive_bytes": 0}
    for operation, capacity in plan.variants():
        _, exported = export_program(arch, operation, capacity, plan.page_tokens, options)
        image, archive = encode_program(exported), _archive(exported)
        image_s, archive_s = _best_times(image, archive, args.repeats)
        row = {"program": f"{operation.value} R={capacity.batch_capacity} T={capacity.packed_token_capacity}",
               "image_s": image_s, "archive_s": archive_s, "image_bytes": len(image), "archive_bytes": len(archive)}
        rows.append(row)
        for key in totals:
            totals[key] += row[key]
        print(f"{row['program']:<28} image {image_s * 1e3:8.1f} ms ({len(image) / 1e6:5.2f} MB)   "
              f"archive {archive_s * 1e3:8.1f} ms ({len(archive) / 1e6:5.2f} MB)   ratio {image_s / archive_s:5.2f}",
              flush=True)
    ratio = totals["image_s"] / totals["archive_s"]
    print(f"{'total (' + str(len(rows)) + ' programs)':<28} image {totals['image_s']:.3f} s   "
          f"archive {totals['archive_s']:.3f} s   image/archive {ratio:.2f}x   "
          f"bytes {totals['image_bytes'] / 1e6:.2f} MB / {totals['archive_bytes'] / 1e6:.2f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "rows": rows, "totals": totals,
                                               "image_over_archive": ratio}, indent=1) + "\n")
    return 0


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="checkpoint directory (default: the embedded model)")
    parser.add_argument("--fixture", action="store_true", help="the tiny Qwen3 fixture model's shapes and plan")
    parser.add_argument("--decode-batches", default=None, help="comma-separated decode batch capacities")
    parser.add_argument("--context-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures to this file")
    return parser.parse_args()


def _checkpoint_and_plan(args) -> tuple[Path, CapacityPlan]:
    if args.fixture:
        import tempfile

        sys.path.insert(0, str(ROOT / "tests"))
        from ignition.hf_checkpoints import QWEN3
        from support.chat_checkpoint import write_chat_checkpoint

        checkpoint = write_chat_checkpoint(QWEN3, Path(tempfile.mkdtemp()) / "checkpoint", seed=11)
        return checkpoint, CapacityPlan(page_tokens=8, context_tokens=64, prefill_tokens=16, decode_batches=(1, 4))
    from helios.embedded import default_model_dir
    from helios.embedded import prepared as embedded

    checkpoint = args.checkpoint or default_model_dir()
    batches = tuple(int(b) for b in args.decode_batches.split(",")) if args.decode_batches else embedded.DECODE_BATCHES
    context = args.context_tokens or embedded._context_tokens(checkpoint)
    return checkpoint, CapacityPlan(context_tokens=context, decode_batches=batches)


def _archive(exported: torch.export.ExportedProgram) -> bytes:
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    return buffer.getvalue()


def _best_times(image: bytes, archive: bytes, repeats: int) -> tuple[float, float]:
    image_times, archive_times = [], []
    for _ in range(repeats):  # interleaved, so both see the same machine load
        start = time.perf_counter()
        deserialize_program(read_program_image(image)).module()
        image_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        torch.export.load(io.BytesIO(archive)).module()
        archive_times.append(time.perf_counter() - start)
    return min(image_times), min(archive_times)


if __name__ == "__main__":
    sys.exit(main())
