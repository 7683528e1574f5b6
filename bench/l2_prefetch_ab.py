"""The one-row output projection with its weight asked into L2 while the attention before it runs:
how much of a batch-1 step's projections could the idle memory under attention hide?

At one row the decode step reads every weight once; the projections run at 3.45 TB/s for qkv, output
and down together against 4.08 for gate/up (bench/results/h200_session38_call4: the small kernels
ramp up and drain), and attention (8.7 us a layer) leaves the memory nearly idle while it reads a
few hundred KB of keys and values. The output projection's weight (4096 x 4096, 33.5 MB) fits in
the H200's 50 MB L2: fetched there during attention, the projection could read it from L2.

Each variant is one CUDA graph of `--layers` repetitions of [an attention stand-in, the output
projection on that layer's own weight] (distinct weights: no reuse across layers), timed as a median
replay and sustained; the stand-in is a one-program kernel that lets the next kernel launch at once
(programmatic dependent launch, as the served decode attention does) and spins for about
`--spacer-us`. Per layer, less the stand-in alone:

- ``cold``: the projection on the skinny kernel as served (dependent launch, its programs asking L2
  for the first `PREFETCH_COLUMNS` columns of their rows before they wait), and with other prefetch
  widths (``--prefetch``), 4096 being the whole row;
- ``warm``: every layer on the same weight, resident in L2 after the first: the bound;
- ``side``: a prefetch kernel over the layer's whole weight on a second stream beside the stand-in,
  joined before the projection;
- ``inline``: the prefetch kernel on the same stream right before the stand-in (it only issues the
  requests, so the stand-in runs while the lines arrive).

    python bench/l2_prefetch_ab.py [--layers 32] [--spacer-us 8.7] [--prefetch 0,256,1024,4096]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lever_ab import graph_ms  # noqa: E402

from helios.abi import dependent_launch  # noqa: E402
from helios.abi.gemv_tiles import skinny_tile  # noqa: E402
from helios.abi.triton_skinny import skinny  # noqa: E402

DEPTH = 4096  # the 8B decoder's output projection: [4096, 4096]
LINE = 64  # bfloat16 elements in a 128-byte line


@triton.jit
def _spacer_kernel(value_ptr, out_ptr, iterations):
    """An attention stand-in: lets the next kernel launch, waits for the previous one, then runs a
    dependent chain of `iterations` multiply-adds on one program."""
    tl.extra.cuda.gdc_launch_dependents()
    tl.extra.cuda.gdc_wait()
    value = tl.load(value_ptr)
    for _ in range(iterations):
        value = value * 0.999999 + 0.5
    tl.store(out_ptr, value)


@triton.jit
def _prefetch_kernel(w_ptr, lines_per_program, BLOCK: tl.constexpr):
    """Asks L2 for `lines_per_program` 128-byte lines of `w_ptr` a program (never waits for them)."""
    first = tl.program_id(0).to(tl.int64) * lines_per_program
    for start in range(0, lines_per_program, BLOCK):
        at = w_ptr + (first + start + tl.arange(0, BLOCK)) * 64
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [at], dtype=tl.int32,
                                  is_pure=False, pack=1)


def spacer(value: torch.Tensor, out: torch.Tensor, iterations: int) -> None:
    _spacer_kernel[(1,)](value, out, iterations, num_warps=1, launch_pdl=True)


def prefetch(weight: torch.Tensor, programs: int = 128, block: int = 256) -> None:
    lines = weight.numel() // LINE
    assert lines % (programs * block) == 0, "the weight's lines split evenly over the programs"
    _prefetch_kernel[(programs,)](weight, lines // programs, BLOCK=block, num_warps=4)


def calibrated(value, out, target_us: float, layers: int) -> int:
    """Spacer iterations that take about `target_us` each."""
    probe = 2000
    per = graph_ms(lambda: spacer(value, out, probe), repeat=layers) / layers * 1e3 / probe
    return max(1, round(target_us / per))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--spacer-us", type=float, default=8.7, help="the attention stand-in's time a layer")
    parser.add_argument("--prefetch", default="0,256,1024,4096", help="columns the projection's programs prefetch")
    parser.add_argument("--sustain-ms", type=float, default=300.0)
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of every variant")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (Hopper: programmatic dependent launch)")
    torch.manual_seed(0)
    weights = [torch.randn(DEPTH, DEPTH, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(args.layers)]
    x = torch.randn(1, DEPTH, device="cuda", dtype=torch.bfloat16)
    tile = skinny_tile(1, DEPTH, DEPTH, torch.bfloat16)
    value, out = torch.ones(1, device="cuda"), torch.empty(1, device="cuda")
    iterations = calibrated(value, out, args.spacer_us, args.layers)
    print(f"tile {tile.label}, dependent launch {dependent_launch.dependent_launch(x)}, served prefetch "
          f"{dependent_launch.PREFETCH_COLUMNS} columns; stand-in {iterations} iterations", flush=True)
    expected = F.linear(x, weights[3])
    assert torch.allclose(skinny(x, weights[3], None, tile).float(), expected.float(), atol=2e-2, rtol=2e-2)

    def layers(project, before=lambda w: None, side=None):
        def call():
            for weight in weights:
                if side is not None:
                    fork = torch.cuda.current_stream()
                    side.wait_stream(fork)
                    with torch.cuda.stream(side):
                        prefetch(weight)
                before(weight)
                spacer(value, out, iterations)
                if side is not None:
                    fork.wait_stream(side)
                project(weight)
        return call

    side_stream = torch.cuda.Stream()
    variants = {"stand-in alone": layers(lambda w: None)}
    for columns in (int(c) for c in args.prefetch.split(",") if c):
        variants[f"cold, prefetch {columns}"] = layers(lambda w, c=columns: skinny(x, w, None, tile, prefetch=c))
    variants["warm (one weight, L2-resident)"] = layers(lambda w: skinny(x, weights[0], None, tile))
    variants["side (prefetch kernel beside)"] = layers(lambda w: skinny(x, w, None, tile), side=side_stream)
    variants["inline (prefetch kernel before)"] = layers(lambda w: skinny(x, w, None, tile), before=prefetch)
    variants["prefetch kernel + stand-in"] = layers(lambda w: None, before=prefetch)
    held: dict[str, list[tuple[float, float]]] = {label: [] for label in variants}
    for round_ in range(args.rounds):
        for label, call in list(variants.items()):
            try:
                rested = graph_ms(call) / args.layers * 1e3
                sustained = graph_ms(call, sustain_ms=args.sustain_ms) / args.layers * 1e3
            except Exception as error:  # one variant failing to build or capture leaves the others
                print(f"{label}: {type(error).__name__}: {str(error)[:300]}", flush=True)
                del variants[label], held[label]
                continue
            held[label].append((rested, sustained))
            print(f"round {round_} {label:<34} rested {rested:6.2f} us a layer, sustained {sustained:6.2f}", flush=True)
    medians = {label: tuple(sorted(t[i] for t in times)[len(times) // 2] for i in range(2))
               for label, times in held.items()}
    base = medians["stand-in alone"]
    gigabytes = DEPTH * DEPTH * 2 / 1e9
    print("\n| variant (one row, a layer) | rested us | less the stand-in | TB/s of weight | sustained us | less the stand-in |")
    print("|---|---|---|---|---|---|")
    for label, (rested, sustained) in medians.items():
        alone = rested - base[0]
        rate = f"{gigabytes / alone * 1e3:.2f}" if alone > 0 and label != "stand-in alone" else ""
        print(f"| {label} | {rested:.2f} | {alone:.2f} | {rate} | {sustained:.2f} | {sustained - base[1]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
