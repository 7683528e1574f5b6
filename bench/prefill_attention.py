"""Prefill attention at Llama-3.1-8B shapes: the old prefill kernel, the new one (as served, and over a
sweep of tiles, packed and per head, and split counts), and torch's scaled_dot_product_attention as the
ceiling.

Shapes: 32 query heads, 8 key/value heads, head_dim 128, bfloat16, pages of 16 on a random page order,
a page table of ``--capacity`` positions (a serving capacity). Cases, one row each: 2,048 new tokens
cold, 208 new after 1,840 cached (90% cached), 512 cold, 128 cold, 128 after 1,920 cached (a short
launch after a long prefix: what an unsplit short tile costs), and the 208 after 1,840 as served
(padded to its 256-token chunk capacity, which sets the split count); then a mixed step (64 decode
lanes at 1,024 beside a 256-token chunk), old against new. Rows per case:

- ``old``: the prefill kernel before the FlashAttention-2 rewrite (`bench/decode_attention_baseline.py`);
- ``new``: `paged_attention_prefill` as served (`prefill_tile`, the `prefill_splits` rule);
- ``tile ...``: each ``--tiles`` entry at the rule's split count for it (`PrefillTile.name`:
  ``[h][c]PAIRSxNxWARPSxSTAGES[xMIN_SPLIT[xMAX_SPLITS]]``, h: one query head per program, token-major;
  c: fused combine, no combine launch); ``splits ...``: each ``--splits`` count at the served tile;
- ``sdpa``: ``scaled_dot_product_attention`` (flash backend, contiguous K/V expanded to 32 heads, causal
  aligned to the last key) on the same values: the ceiling (on the CPU, ``--smoke``: the math backend).

Each call is captured in a CUDA graph and its replays timed (median of ``triton.testing.do_bench``).
First, ``--jobs`` processes compile every variant side by side into Triton's cache (a serial first run
spends most of its time compiling).
Every line prints microseconds, TFLOP/s of the causal QK and PV products, and ratios to old and to
sdpa; every variant is checked against the CPU reference first. Then the 32-layer totals and, per
launch size class of `helios.abi.triton_prefill_tiles` (LONG_PREFILL_TILES from LONG_PREFILL_TOKENS,
SHORT_PREFILL_TILES below SHORT_PREFILL_TOKENS, PREFILL_TILES between), the tile of least summed time
over that class's cases against the served one, and the split rule (``PREFILL_PROGRAMS_PER_MULTIPROCESSOR``).

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

# PrefillTile names: [h][c]block_pairs x block_n x num_warps x num_stages [x min_split_tokens [x max_splits]]
# (h: per head, c: fused combine). 128x64x4 and 128x128x8x2 (packed) spill registers.
TILES = ",".join([
    "128x64x8x3", "128x128x8x3", "64x64x4x2", "64x64x4x2x256x1", "128x64x8x3x256x1",  # packed
    "h128x64x8x3", "h128x128x8x3", "h128x64x8x4", "h128x128x8x2", "h64x64x4x3", "h64x128x4x2",  # per head
    "h64x64x4x2x256x1", "c128x64x8x3", "c64x64x4x2", "hc128x64x8x3", "hc64x64x4x3",  # fused combine
    "t128x128x8x3", "ht128x128x8x3", "ht128x64x8x3", "ht64x64x4x3",  # descriptor loads on consecutive pages
])
# (new tokens, cached tokens, packed tokens) of one row: the last, as served, pads the 208-token rest of a
# 90%-cached prompt to the 256-token chunk capacity that runs it (bench/ttft_breakdown.py's --chunks).
# A fourth entry True: the row's pages are consecutive in the cache (a fresh prompt on in-order pages:
# the "t" tiles read its keys and values through tensor descriptors), else random.
CASES = ((2048, 0, 2048), (2048, 0, 2048, True), (208, 1840, 208), (512, 0, 512), (128, 0, 128), (128, 1920, 128),
         (208, 1840, 256))
SMOKE_CASES = ((24, 0, 24), (24, 0, 24, True), (6, 40, 6), (12, 0, 12), (4, 0, 4), (4, 40, 4), (6, 40, 8))
# (decode lanes, their context, chunk tokens, the chunk's row context) of a mixed step
MIXED, SMOKE_MIXED = (64, 1024, 256, 2048), (5, 20, 8, 30)
LAYERS = 32
STARTED = time.perf_counter()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script runs)")
    parser.add_argument("--capacity", type=int, default=4096, help="capacity context (page-table width x 16)")
    parser.add_argument("--tiles", default=TILES)
    parser.add_argument("--splits", default="1,2,4")
    parser.add_argument("--split-tile", default=None, help="the tile of the split sweep (default: the served one)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)),
                        help="processes compiling the kernel variants side by side before the timing (1: none)")
    return parser.parse_args(argv)


class Case:
    """One row of `new` tokens after `cached`: the op's arguments, the causal FLOPs, the reference."""

    def __init__(self, config: Config, caches, shape: tuple, capacity: int, device):
        new, cached, packed = shape[:3]
        self.consecutive = len(shape) > 3 and shape[3]
        step = make_step(config, [new], [new + cached], caches[0].shape[0], device)
        if self.consecutive:
            step.page_table[0] = torch.arange(step.page_table.shape[1], dtype=torch.int32, device=device)
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
        label += " on consecutive pages" if self.consecutive else ""
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
    max_context = case.step.page_table.shape[1] * case.config.page_tokens
    rule = rule_splits(tile, case.config, case.packed, max_context, prefill, device)
    new = timed(lambda: prefill.paged_attention_prefill(*case.args()), case, device)
    rows.append(line(f"new ({tile.name}, {rule} splits)", new, case, old, ceiling))
    tiles, splits = {}, {}
    for name in args.tiles.split(","):
        swept = prefill.parse_tile(name)
        seconds = try_time(lambda: prefill.paged_attention_prefill(*case.args(), tile=swept), case, device)
        if seconds:
            tiles[name] = seconds
            count = rule_splits(swept, case.config, case.packed, max_context, prefill, device)
            rows.append(line(f"tile {name} ({count} splits)", seconds, case, old, ceiling))
    split_tile = prefill.parse_tile(args.split_tile) if args.split_tile else tile
    for count in (int(s) for s in args.splits.split(",")):
        seconds = try_time(lambda: prefill.paged_attention_prefill(*case.args(), tile=split_tile, splits=count),
                           case, device)
        if seconds:
            splits[count] = seconds
            rows.append(line(f"splits {count}", seconds, case, old, ceiling))
    return {"new_tokens": case.new, "cached": case.cached, "packed": case.packed, "flops": case.flops, "rows": rows,
            "label": case.label(), "consecutive": case.consecutive,
            "old": old, "new": new, "served": tile.name, "sdpa": ceiling, "tiles": tiles, "splits": splits,
            "split_tile": split_tile.name, "rule_splits": rule, "max_context": max_context}


def rule_splits(tile, config: Config, packed: int, max_context: int, prefill, device,
                per_multiprocessor: int | None = None) -> int:
    """The split count `paged_attention_prefill` resolves for `tile` on one row of `packed` tokens."""
    group = config.num_heads // config.num_kv_heads
    blocks = packed // tile.block_tokens(group) + 1
    options = {} if per_multiprocessor is None else {"per_multiprocessor": per_multiprocessor}
    return prefill.prefill_splits(blocks, config.num_heads // tile.heads_per_program(group), max_context, device,
                                  tile.min_split_tokens, max_splits=tile.max_splits, **options)


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
    line(f"new ({tile.name})", new, case, old, None)
    return {"lanes": list(lanes), "old": old, "new": new}


def summarise(results: list[dict], prefill, device) -> None:
    """32-layer totals per case; per launch size class the tile of least summed time over its cases
    against the served tile's; the split rule's programs per multiprocessor (least summed time at the
    split counts each value asks, over every case)."""
    for result in results:
        ceiling = f", sdpa {result['sdpa'] * LAYERS * 1e3:.2f} ms" if result["sdpa"] else ""
        old, new = result["old"] * LAYERS * 1e3, result["new"] * LAYERS * 1e3
        print(f"{LAYERS} layers, {result['label']}: old {old:.2f} ms, new {new:.2f} ms{ceiling}", flush=True)
    for result in results:
        if result["tiles"]:
            best = min(result["tiles"], key=result["tiles"].get)
            print(f"best tile for {result['label']}: {best} {result['tiles'][best] * 1e6:.1f} us "
                  f"(served {result['served']} {result['new'] * 1e6:.1f} us)", flush=True)
    classes = {"LONG_PREFILL_TILES": lambda n: n >= prefill.LONG_PREFILL_TOKENS,
               "SHORT_PREFILL_TILES": lambda n: n < prefill.SHORT_PREFILL_TOKENS,
               "PREFILL_TILES": lambda n: prefill.SHORT_PREFILL_TOKENS <= n < prefill.LONG_PREFILL_TOKENS}
    for table, member in classes.items():
        chosen = [r for r in results if member(r["packed"])]
        common = set.intersection(*(set(r["tiles"]) for r in chosen)) if chosen else set()
        if not common:
            continue
        best = min(common, key=lambda name: sum(r["tiles"][name] for r in chosen))
        served = sum(r["new"] for r in chosen)
        summed = sum(r["tiles"][best] for r in chosen)
        print(f"suggested {table}[128] = parse_tile({best!r}) (summed {summed * 1e6:.1f} "
              f"us over {len(chosen)} cases; served {', '.join(sorted({r['served'] for r in chosen}))} "
              f"{served * 1e6:.1f} us)", flush=True)
    config = FULL if device.type == "cuda" else SMOKE
    totals = {}
    for per_sm in (1, 2, 3, 4):
        asked = [rule_splits(prefill.parse_tile(r["split_tile"]), config, r["packed"], r["max_context"], prefill,
                             device, per_sm) for r in results]
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
    max_context = -(-args.capacity // config.page_tokens) * config.page_tokens
    device = torch.device("cuda")
    labels = {"old:1"}
    for packed in (case[2] for case in cases):
        served = prefill.prefill_tile(config.head_dim, torch.bfloat16, packed, 1)
        for tile in [served, *map(prefill.parse_tile, args.tiles.split(","))]:
            labels.add(f"{tile.name}:{rule_splits(tile, config, packed, max_context, prefill, device)}")
        split_tile = prefill.parse_tile(args.split_tile) if args.split_tile else served
        labels.update(f"{split_tile.name}:{count}" for count in args.splits.split(","))
    labels.add(f"{prefill.SHORT_ROWS_TILE.name}:1")  # the mixed step
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
                prefill.paged_attention_prefill(*args, tile=prefill.parse_tile(name), splits=int(count))
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
        args.capacity, args.splits, args.split_tile = 64, "1,3", "16x16x2x1x16"
        args.tiles = "16x16x2x1,32x16x4x2,h16x16x2x1x16,h16x16x2x1x256x1,hc16x16x2x1x16,ht16x16x2x1x16"
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
    num_pages = max(sum(-(-(new + cached) // config.page_tokens) for new, cached, *_ in cases),
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
