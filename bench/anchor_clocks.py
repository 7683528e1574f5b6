"""The compiled anchor run alone, with the GPU's SM clock and power over each batch's timed decode loop.

`compiled_anchor.py` prefills, compiles its decode step (tens of seconds: the device idles and leaves
its power cap), warms it, then times its decode loop; this runs it (`--batches`, 128-token prompts and
128 steps as `bench/anchor_compare.py` does) with `gpu_clocks.ClockLog` sampling and, as each batch's
result line is printed, reports the samples of that batch's timed window (its ``step_ms`` times its
steps, ending at the line). What a comparison with a served engine, whose decode follows its prefill
at once, needs to say under which clock each side was measured.

    python bench/anchor_clocks.py --anchor .anchor/compiled_anchor.py [--batches 256] [--layers 32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_clocks import ClockLog, describe  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor", type=Path, required=True, help="the anchor script (compiled_anchor.py)")
    parser.add_argument("--batches", default="256")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="the anchor's tiny CPU shapes (checks this script runs)")
    args = parser.parse_args(argv)
    command = [sys.executable, str(args.anchor), "--layers", str(args.layers), "--batches", args.batches,
               "--prompt", str(args.prompt), "--steps", str(args.steps)] + (["--smoke"] if args.smoke else [])
    rows = []
    with ClockLog(interval_ms=50) as clocks:
        clocks.phase("anchor")
        with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
            for line in process.stdout:
                printed = time.perf_counter()
                print(line.rstrip(), flush=True)
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(row, dict) or "step_ms" not in row:
                    continue
                timed = row["step_ms"] * (args.steps - 8) / 1e3  # the anchor times steps - 8 steps
                time.sleep(0.2)  # the sampler's last samples of the window
                row["clocks"] = clocks.window(printed - timed, printed)
                rows.append(row)
                print(f"anchor batch {row['batch']}: {row['decode_tok_s']:.1f} tok/s over {timed:.2f} s; clocks "
                      + (describe(row["clocks"]) if row["clocks"] else "none sampled"), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
