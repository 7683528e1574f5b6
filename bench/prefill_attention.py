"""Prefill attention at Llama-3.1-8B shapes: the old prefill kernel, the new one (as served, and over a
sweep of tiles and split counts), and torch's scaled_dot_product_attention as the ceiling.

Shapes: 32 query heads, 8 key/value heads, head_dim 128, bfloat16, pages of 16 on a random page order,
a page table of ``--capacity`` positions (a serving capacity). Cases, one row each: 2,048 new tokens
cold, 208 new after 1,840 cached (90% cached), 512 cold, 128 cold, and the 208 after 1,840 as served
(padded to its 256-token chunk capacity, which sets the split count); then a mixed step (64 decode
lanes at 1,024 beside a 256-token chunk), old against new. Rows per case:

- ``old``: the prefill kernel before the FlashAttention-2 rewrite (`bench/decode_attention_baseline.py`);
- ``new``: `paged_attention_prefill` as served (`prefill_tile`, the `prefill_splits` rule);
- ``tile ...``: each ``--tiles`` entry at the rule's split count; ``splits ...``: each ``--splits``
  count at the served tile;
- ``sdpa``: ``scaled_dot_product_attention`` (flash backend, contiguous K/V expanded to 32 heads, causal
  aligned to the last key) on the same values: the ceiling (on the CPU, ``--smoke``: the math backend).

Each call is captured in a CUDA graph and its replays timed (median of ``triton.testing.do_bench``).
First, ``--jobs`` processes compile every variant side by side into Triton's cache (a serial first run
spends most of its time compiling).
Every line prints microseconds, TFLOP/s of the causal QK and PV products, and ratios to old and to
sdpa; every variant is checked against the CPU reference first. Then the 32-layer totals and the
suggested `helios.abi.triton_prefill.PREFILL_TILES` entry and split rule
(``PREFILL_PROGRAMS_PER_MULTIPROCESSOR``).

    python bench/prefill_attention.py [--json out.json] [--tiles ...] [--splits 1,2,4,8]
    python bench/prefill_attention.py --smoke   # tiny shapes, Triton interpreter, CPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_kernels import FULL, SMOKE, Config, make_caches, make_step, median_seconds  # noqa: E402

# block_pairs x block_n x num_warps x num_stages
TILES = "128x64x8x2,128x64x8x3,128x64x8x4,128x128x8x3,64x64x4x3,64x64x4x2"  # 128x64x4 and 128x128x8x2 spill registers
# (new tokens, cached tokens, packed tokens) of one row: the last, as served, pads the 208-token rest of a
# 90%-cached prompt to the 256-token chunk capacity that runs it (bench/ttft_breakdown.py's --chunks).
CASES = ((2048, 0, 2048), (208, 1840, 208), (512, 0, 512), (128, 0, 128), (208, 1840, 256))
SMOKE_CASES = ((24, 0, 24), (6, 40, 6), (12, 0, 12), (4, 0, 4), (6, 40, 8))
# (decode lanes, their context, chunk tokens, the chunk's row context) of a mixed step
MIXED, SMOKE_MIXED = (64, 1024, 256, 2048), (5, 20, 8, 30)
LAYERS = 32
STARTED = time.perf_counter()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script runs)")
    parser.add_argument("--capacity", type=int, default=4096, help="capacity context (page-table width x 16)")
    parser.add_argument("--tiles", default=TILES)
    parser.add_argument("--splits", default="1,2,3,4")
    parser.add_argument("--split-tile", default=None, help="the tile of the split sweep (default: the served one)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)),
                        help="processes compiling the kernel variants side by side before the timing (1: none)")
    return parser.parse_args(argv)


class Case:
    """One row of `new` tokens after `cached`: the op's arguments, the causal FLOPs, the reference."""

    def __init__(self, config: Config, caches, shape: tuple[int, int, int], capacity: int, device):
        new, cached, packed = shape
        step = make_step(config, [new], [new + cached], caches[0].shape[0], device)
        table = torch.zeros(1, -(-capacity // config.page_tokens), dtype=torch.int32, device=device)
        table[:, : step.page_table.shape[1]] = step.page_table
        q = torch.cat([step.q, step.q.new_zeros(packed - new, *step.q.shape[1:])])  # padding tokens
        positions = torch.cat([step.positions, step.positions.new_zeros(packed - new)])
        self.step = step._replace(q=q, page_table=table, positions=positions)
        self.caches, self.new, self.cached, self.packed, self.config = caches, new, cached, packed, config
        self.scale = config.head_dim ** -0.5
        self.flops = 4 * config.num_heads * config.head_dim * sum(range(cached + 1, cached + new + 1))
        cpu = [t.cpu() for t in (self.step.q, *caches, *self.step[1:])]
        self.expected = torch.ops.helios.paged_attention(*cpu, self.scale, 0).float()

    def args(self):
        return (self.step.q, *self.caches, *self.step[1:], self.scale, 0)

    def label(self) -> str:
        label = f"{self.new} tokens after {self.cached} cached" if self.cached else f"{self.new} tokens cold"
        return label + (f" in a {self.packed}-token capacity" if self.packed != self.new else "")


def timed(fn, case: Case, device) -> float:
    """Seconds per call of fn() (CUDA graph replays), after checking its output against the reference."""
    got = fn()
    torch.testing.assert_close(got.float().cpu(), case.expected, rtol=2e-2, atol=2e-2)
    return median_seconds(fn, device, captured=device.type == "cuda")


def sdpa_call(case: Case, device):
    """The ceiling: SDPA over the row's keys and values gathered contiguous [1, Hq, L, D], causal
    aligned to the last key. Returns (fn giving [T, Hq, D], backend label) per backend to try, best
    first (flash, then memory-efficient, on CUDA; math on the CPU)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config, step = case.config, case.step
    context = case.new + case.cached
    pages = step.page_table[0, : -(-context // config.page_tokens)].long()
    group = config.num_heads // config.num_kv_heads
    k, v = (plane[pages].reshape(-1, config.num_kv_heads, config.head_dim)[:context] for plane in case.caches)
    k, v = (x.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0).contiguous() for x in (k, v))
    q = step.q[: case.new].transpose(0, 1).unsqueeze(0).contiguous()
    if case.cached:
        from torch.nn.attention.bias import causal_lower_right

        mask, causal = causal_lower_right(case.new, context), False
    else:
        mask, causal = None, True

    def call(backend):
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                                   scale=case.scale)
        out = out.squeeze(0).transpose(0, 1)
        padding = out.new_zeros(case.packed - case.new, *out.shape[1:])
        return torch.cat([out, padding]) if len(padding) else out

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION] if device.type == "cuda" else \
        [SDPBackend.MATH]
    return [(lambda b=b: call(b), b.name.lower()) for b in backends]


def line(label: str, seconds: float, case: Case, old: float | None, ceiling: float | None) -> dict:
    versus = (f" {old / seconds:5.2f}x old" if old else "") + (f" {ceiling / seconds:5.2f}x sdpa" if ceiling else "")
    print(f"  {label:<34} {seconds * 1e6:9.1f} us {case.flops / seconds / 1e12:7.1f} TFLOP/s{versus}", flush=True)
    return {"label": label, "us": seconds * 1e6, "tflops": case.flops / seconds / 1e12}


def try_time(fn, case: Case, device) -> float | None:
    try:
        return timed(fn, case, device)
    except Exception as error:  # noqa: BLE001  (a variant the device cannot run is reported, not fatal)
        print(f"    failed: {type(error).__name__}: {str(error)[:160]}", flush=True)
        return None


def run_case(case: Case, old_module, prefill, args, device) -> dict:
    print(f"prefill {case.label()} ({case.flops / 1e9:.2f} GFLOP per layer) [{time.perf_counter() - STARTED:.0f} s]",
          flush=True)
    ceiling, rows = None, []
    for sdpa, backend in sdpa_call(case, device):
        ceiling = try_time(sdpa, case, device)
        if ceiling:
            rows.append(line(f"sdpa ({backend}, contiguous K/V)", ceiling, case, None, None))
            break
    old = timed(lambda: old_module.paged_attention_prefill(*case.args()), case, device)
    rows.append(line("old", old, case, None, ceiling))
    tile = prefill.prefill_tile(case.config.head_dim, case.step.q.dtype, case.packed, 1)
    block_m = max(1, tile.block_pairs // _block_g(case.config))
    max_context = case.step.page_table.shape[1] * case.config.page_tokens
    rule = prefill.prefill_splits(case.packed // block_m + 1, case.config.num_kv_heads, max_context, device)
    new = timed(lambda: prefill.paged_attention_prefill(*case.args()), case, device)
    rows.append(line(f"new ({_tile_name(tile)}, {rule} splits)", new, case, old, ceiling))
    tiles, splits = {}, {}
    for name in args.tiles.split(","):
        swept = prefill.PrefillTile(*map(int, name.split("x")))
        seconds = try_time(lambda: prefill.paged_attention_prefill(*case.args(), tile=swept), case, device)
        if seconds:
            tiles[name] = seconds
            rows.append(line(f"tile {name}", seconds, case, old, ceiling))
    split_tile = prefill.PrefillTile(*map(int, args.split_tile.split("x"))) if args.split_tile else tile
    for count in (int(s) for s in args.splits.split(",")):
        seconds = try_time(lambda: prefill.paged_attention_prefill(*case.args(), tile=split_tile, splits=count),
                           case, device)
        if seconds:
            splits[count] = seconds
            rows.append(line(f"splits {count}", seconds, case, old, ceiling))
    return {"new_tokens": case.new, "cached": case.cached, "packed": case.packed, "flops": case.flops, "rows": rows,
            "old": old, "new": new, "sdpa": ceiling, "tiles": tiles, "splits": splits, "rule_splits": rule,
            "block_m": block_m, "max_context": max_context, "num_kv_heads": case.config.num_kv_heads}


def run_mixed(config: Config, caches, lanes: tuple[int, int, int, int], old_module, prefill, device) -> dict:
    """Decode lanes beside a prompt chunk in one packed step (a mixed step: the prefill kernel serves
    it, with `prefill_tile`'s short-rows tile): old against new only (no single-sequence ceiling)."""
    num_lanes, lane_context, chunk, chunk_context = lanes
    step = make_step(config, [1] * num_lanes + [chunk], [lane_context] * num_lanes + [chunk_context],
                     caches[0].shape[0], device)
    scale = config.head_dim ** -0.5
    cpu = [t.cpu() for t in (step.q, *caches, *step[1:])]
    expected = torch.ops.helios.paged_attention(*cpu, scale, 0).float()
    tokens = num_lanes + chunk
    flops = 4 * config.num_heads * config.head_dim * (num_lanes * lane_context
                                                      + sum(range(chunk_context - chunk + 1, chunk_context + 1)))
    case = argparse.Namespace(expected=expected, flops=flops)
    args = (step.q, *caches, *step[1:], scale, 0)
    tile = prefill.prefill_tile(config.head_dim, step.q.dtype, tokens, num_lanes + 1)
    print(f"mixed step: {num_lanes} decode lanes at {lane_context} + a {chunk}-token chunk ending at {chunk_context} "
          f"[{time.perf_counter() - STARTED:.0f} s]", flush=True)
    old = timed(lambda: old_module.paged_attention_prefill(*args), case, device)
    line("old", old, case, None, None)
    new = timed(lambda: prefill.paged_attention_prefill(*args), case, device)
    line(f"new ({_tile_name(tile)})", new, case, old, None)
    return {"lanes": list(lanes), "old": old, "new": new}


def _block_g(config: Config) -> int:
    return 1 << (config.num_heads // config.num_kv_heads - 1).bit_length()


def _tile_name(tile) -> str:
    return "x".join(map(str, tile.__dict__.values()))


def summarise(results: list[dict], prefill, device) -> None:
    """32-layer totals per case, the suggested tile (least summed time over the cases) and the split
    rule's programs per multiprocessor (least summed time at the splits each value asks)."""
    for result in results:
        ceiling = f", sdpa {result['sdpa'] * LAYERS * 1e3:.2f} ms" if result["sdpa"] else ""
        old, new = result["old"] * LAYERS * 1e3, result["new"] * LAYERS * 1e3
        print(f"{LAYERS} layers, {result['new_tokens']} after {result['cached']} ({result['packed']} packed): "
              f"old {old:.2f} ms, new {new:.2f} ms{ceiling}", flush=True)
    common = set.intersection(*(set(r["tiles"]) for r in results)) if results else set()
    if common:
        best = min(common, key=lambda name: sum(r["tiles"][name] for r in results))
        print(f"suggested PREFILL_TILES[128] = PrefillTile({', '.join(best.split('x'))}) "
              f"(summed {sum(r['tiles'][best] for r in results) * 1e6:.1f} us)", flush=True)
    totals = {}
    for per_sm in (1, 2, 3, 4):
        asked = [prefill.prefill_splits(r["packed"] // r["block_m"] + 1, r["num_kv_heads"], r["max_context"], device,
                                        per_multiprocessor=per_sm) for r in results]
        picks = [min(r["splits"], key=lambda s, a=a: abs(s - a)) if r["splits"] else None
                 for r, a in zip(results, asked)]
        if all(p is not None for p in picks):
            totals[per_sm] = sum(r["splits"][p] for r, p in zip(results, picks))
    if totals:
        best = min(totals, key=totals.get)
        print(f"suggested PREFILL_PROGRAMS_PER_MULTIPROCESSOR = {best} (summed {totals[best] * 1e6:.1f} us; "
              + ", ".join(f"{k}: {v * 1e6:.1f}" for k, v in sorted(totals.items())) + ")", flush=True)


def variant_labels(cases, args, prefill, config) -> list[str]:
    """Every (tile, split count) the timing launches, as "tile:splits" (tile "old": the old kernel),
    with the split count each launch resolves to (`prefill_splits` at the case's shapes)."""
    group_pad = _block_g(config)
    max_context = -(-args.capacity // config.page_tokens) * config.page_tokens
    labels = {"old:1"}
    for _, _, packed in cases:
        served = prefill.prefill_tile(config.head_dim, torch.bfloat16, packed, 1)
        swept = [prefill.PrefillTile(*map(int, name.split("x"))) for name in args.tiles.split(",")]
        for tile in [served, *swept]:
            blocks = packed // max(1, tile.block_pairs // group_pad) + 1
            count = prefill.prefill_splits(blocks, config.num_kv_heads, max_context, torch.device("cuda"),
                                           tile.min_split_tokens)
            labels.add(f"{_tile_name(tile)}:{count}")
        split_tile = prefill.PrefillTile(*map(int, args.split_tile.split("x"))) if args.split_tile else served
        labels.update(f"{_tile_name(split_tile)}:{count}" for count in args.splits.split(","))
    labels.add(f"{_tile_name(prefill.SHORT_ROWS_TILE)}:1")  # the mixed step
    return sorted(labels)


def _compile_variants(job: tuple[int, list[str]]) -> int:
    """(In a worker process.) Launch each "tile:splits" once on a small row at the benchmark's shapes
    and capacity, so Triton's on-disk cache holds its kernels (the same specialisation: the strides and
    head counts match); returns how many ran."""
    capacity, labels = job
    import decode_attention_baseline as old_module

    import helios.abi  # noqa: F401  (registers the ops)
    from helios.abi import triton_prefill as prefill

    device = torch.device("cuda")
    caches = make_caches(FULL, 16, device)
    step = make_step(FULL, [64], [200], 16, device)
    table = torch.zeros(1, -(-capacity // FULL.page_tokens), dtype=torch.int32, device=device)
    table[:, : step.page_table.shape[1]] = step.page_table
    args = (step.q, *caches, table, step.query_start, step.positions, FULL.head_dim ** -0.5, 0)
    done = 0
    for label in labels:
        name, count = label.split(":")
        try:
            if name == "old":
                old_module.paged_attention_prefill(*args)
            else:
                tile = prefill.PrefillTile(*map(int, name.split("x")))
                prefill.paged_attention_prefill(*args, tile=tile, splits=int(count))
            done += 1
        except Exception:  # noqa: BLE001  (the timing reports a variant that fails)
            pass
    torch.cuda.synchronize()
    return done


def precompile(labels: list[str], capacity: int, jobs: int) -> None:
    """Compile the variants in `jobs` processes side by side (the timing then loads them from
    Triton's cache): a serial first run spends most of its time compiling."""
    import multiprocessing

    if jobs <= 1 or not labels:
        return
    start = time.perf_counter()
    chunks = [(capacity, labels[i::jobs]) for i in range(min(jobs, len(labels)))]
    with multiprocessing.get_context("spawn").Pool(len(chunks)) as pool:
        done = sum(pool.map(_compile_variants, chunks))
    print(f"precompiled {done} of {len(labels)} variants in {len(chunks)} processes "
          f"({time.perf_counter() - start:.1f} s)", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        from helios.abi.triton_interpret import enable_interpreter

        enable_interpreter()
        args.capacity, args.tiles, args.splits, args.split_tile = 64, "16x16x2x1,32x16x4x2", "1,3", "16x16x2x1x16"
    elif not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    import decode_attention_baseline as old_module

    import helios.abi  # noqa: F401  (registers the ops)
    from helios.abi import triton_prefill as prefill

    started = time.perf_counter()
    config, device = (SMOKE, torch.device("cpu")) if args.smoke else (FULL, torch.device("cuda"))
    cases = SMOKE_CASES if args.smoke else CASES
    if not args.smoke:
        precompile(variant_labels(cases, args, prefill, config), args.capacity, args.jobs)
    torch.manual_seed(0)
    mixed = SMOKE_MIXED if args.smoke else MIXED
    num_pages = max(sum(-(-(new + cached) // config.page_tokens) for new, cached, _ in cases),
                    mixed[0] * -(-mixed[1] // config.page_tokens) + -(-mixed[3] // config.page_tokens)) + 2
    caches = make_caches(config, num_pages, device)
    results = [run_case(Case(config, caches, shape, args.capacity, device), old_module, prefill, args, device)
               for shape in cases]
    mixed_result = run_mixed(config, caches, mixed, old_module, prefill, device)
    summarise(results, prefill, device)
    print(f"done in {time.perf_counter() - started:.1f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"cases": results, "mixed": mixed_result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
