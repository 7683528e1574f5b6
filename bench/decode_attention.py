"""Decode attention at Llama-3.1-8B shapes: the previous kernel (two launches when split) against the
current one (the combine fused into the decode launch), a sweep of tiles, prefetch levels, combines and
split counts, and the fraction of the memory-bandwidth roofline each reaches.

Shapes: 32 query heads, 8 key/value heads, head_dim 128, bfloat16, pages of 16, a capacity context of
``--capacity`` positions (as a serving capacity: every row's page table has that many columns), batches
1/64/256 and contexts 128/256/1024 (the compiled anchor's decode contexts are 128-256; every row of a
case has that context). Each call is captured in a CUDA graph and its replays timed (median of
``triton.testing.do_bench`` with ``--warmup``/``--rep`` milliseconds, L2 flushed before each call, as
the weights of the other layers flush it in a decode step). Rows:

- ``old``: `bench/decode_attention_previous.py` (the kernel before the fused combine: a combine launch
  when split, the row found by search, values loaded after the scores), its split rule and tile table;
- ``new``: ``helios::paged_attention_tuned``'s decode path as served (the tuning rule's split count and
  grid bound, the tile from `decode_tile`);
- ``best``: the fastest tile and split count of the sweep (the grid holds exactly that many splits);
- ``flashinfer`` (with ``--flashinfer``): BatchDecodeWithPagedKVCacheWrapper, if the package imports.

A sweep tile is ``block_n x warps x stages x min_split_tokens x prefetch`` with a trailing ``xc`` for
the two-launch combine and ``xw`` for a wide program (all key/value heads of a token; see
`DecodeTile.parse`); one split runs no combine, so one-split rows are timed
once per (block_n, warps, stages, prefetch). Each row prints microseconds, GB/s of keys and values read,
that rate over the device copy rate measured in the same run (read + write; about the achievable
roofline) and over ``--peak`` (the datasheet bandwidth), and the ratio against ``old``. Every variant's
output is checked against the new kernel's (and the new kernel's against the CPU reference on a small
batch) before it is timed. The last lines suggest `helios.abi.triton_decode.DECODE_TILES` entries and
the split count per batch (with the DECODE_PROGRAMS_PER_MULTIPROCESSOR that gives it). With the defaults
about 45 kernel variants compile; ``--jobs`` processes (default: the CPUs less two, at most 12) compile
them side by side into Triton's cache before the timing starts, which then takes about a minute.

    python bench/decode_attention.py [--json out.json] [--batches 1,64,256] [--contexts 128,256,1024]
    python bench/decode_attention.py --smoke   # tiny shapes, Triton interpreter, CPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_kernels import FULL, SMOKE, Config, copy_bandwidth, kv_bytes, make_caches, make_step  # noqa: E402
from attention_kernels import check_against_reference, median_seconds  # noqa: E402

# block_n x num_warps x num_stages x min_split_tokens x prefetch [x c: the two-launch combine]
# Occupancy from ptxas at 8B shapes (registers, shared memory -> programs per multiprocessor): 64x4x2 96 regs,
# 38 KB -> 5; 32x2x3 150, 38 KB -> 6; 16x2x3 96, 21 KB -> 10; 128x8x2 94, 74 KB -> 2; prefetch 2 (keys and
# values in registers, no cp.async pipeline) 64x4x2 193 regs -> 2; wide (xw, all 8 key/value heads a
# program, 32 query rows) 8x4x3 157, 76 KB -> 3; 8x4x2 213, 44 KB -> 2; 16x8x2 167, 80 KB -> 1.
# kN: N key/value heads a program (a tile's dot is block_n * N columns wide; k4 at group 4 fills the 16
# rows one key/value head pads): fewer, larger programs and 512 B-1 KB contiguous loads per position.
# s: the guessed row's first page entries loaded before the row is known (one dependent load fewer).
TILES_ONE = ("32x4x2x32x1,64x4x2x64x1,128x8x2x128x1,16x2x3x32x1,32x4x2x32x1xc,128x8x2x128x1xs,32x4x2x32x1xk2,"
             "16x4x2x32x1xk4")  # batch 1
TILES_MANY = ("64x4x2x128x1,32x2x3x64x1,16x2x3x64x1,64x4x2x128x1xs,"
              "32x4x2x128x1xk2,32x2x3x128x1xk2,64x8x2x128x1xk2,16x4x2x128x1xk2,32x4x2x128x1xk2xs,"
              "16x4x2x128x1xk4,16x2x3x128x1xk4,32x8x2x128x1xk4,32x4x2x128x1xk4,8x4x3x128x1xk4,16x4x2x128x1xk4xs")
SPLITS_ONE, SPLITS_MANY = "4,8,16", "1,2,4"  # split counts swept at batch 1 / at larger batches
# block_pairs x block_n x num_warps x num_stages
PREFILL_TILES = "64x64x4x2,128x64x4x2,128x64x8x2,128x64x8x3,128x128x8x2,256x64x8x3,64x128x4x3"
PREFILL_CASES = ((2048, 0), (208, 1840), (512, 0))  # (new tokens, cached tokens) of one row


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script runs)")
    parser.add_argument("--batches", default=None)
    parser.add_argument("--contexts", default=None)
    parser.add_argument("--capacity", type=int, default=4112, help="capacity context (page-table width x 16)")
    parser.add_argument("--tiles", default=None, help="sweep tiles for every batch (default: per batch)")
    parser.add_argument("--splits", default=None, help="split counts for every batch (default: per batch)")
    parser.add_argument("--warmup", type=float, default=5.0, help="do_bench warmup, milliseconds")
    parser.add_argument("--rep", type=float, default=25.0, help="do_bench repetition time, milliseconds")
    parser.add_argument("--peak", type=float, default=4.8e12, help="datasheet bytes/s (H200: 4.8 TB/s)")
    parser.add_argument("--flashinfer", action="store_true", help="also time FlashInfer's decode, if it imports")
    parser.add_argument("--no-flashinfer", action="store_true", help="(the default; kept for older command lines)")
    parser.add_argument("--prefill", action="store_true", help="also sweep the prefill kernel's tiles")
    parser.add_argument("--prefill-tiles", default=PREFILL_TILES)
    parser.add_argument("--jobs", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)),
                        help="processes that compile the swept variants first (1: compile as they run)")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def sweep_plan(batch: int, args, decode) -> list[tuple]:
    """(tile, split count) pairs to time at `batch`: every tile at every count, one-split pairs once per
    (block_n, warps, stages, prefetch, wide, kv_heads, speculate) (one split has no combine and no minimum
    run)."""
    tiles = args.tiles or (TILES_ONE if batch == 1 else TILES_MANY)
    counts = [int(c) for c in (args.splits or (SPLITS_ONE if batch == 1 else SPLITS_MANY)).split(",")]
    plan, seen = [], set()
    for tile in (decode.DecodeTile.parse(text) for text in tiles.split(",")):
        for count in counts:
            one = (tile.block_n, tile.num_warps, tile.num_stages, tile.prefetch, tile.wide, tile.kv_heads,
                   tile.speculate)
            key = one if count == 1 else (tile, count)
            if key not in seen:
                seen.add(key)
                plan.append((tile, count))
    return plan


def _compile_variants(job: tuple[int, list[str]]) -> int:
    """(In a worker process.) Launch each (tile label, split count) once on a one-token batch at the
    benchmark's shapes and capacity, so Triton's on-disk cache holds its kernel; returns how many ran."""
    capacity, labels = job
    import helios.abi  # noqa: F401  (registers the ops)
    from helios.abi import triton_decode as decode

    device = torch.device("cuda")
    caches = make_caches(FULL, 8, device)
    step = with_capacity(make_step(FULL, [1], [20], 8, device), -(-capacity // FULL.page_tokens))
    done = 0
    for label in labels:
        text, count = label.rsplit(":", 1)
        splits = torch.tensor([int(count)], dtype=torch.int32, device=device)
        try:
            decode.paged_attention_decode_tuned(step.q, *caches, *step[1:], FULL.head_dim ** -0.5, 0, splits,
                                                tile=decode.DecodeTile.parse(text), bound=int(count))
            done += 1
        except Exception:  # noqa: BLE001  (the sweep reports a tile that fails)
            pass
    torch.cuda.synchronize()
    return done


def precompile(plans: list[list[tuple]], capacity: int, jobs: int) -> None:
    """Compile every swept kernel variant in `jobs` processes side by side (the sweep then loads them
    from Triton's cache): a serial first run spends most of its time compiling."""
    import multiprocessing
    import time

    labels = sorted({f"{tile.label}:{count}" for plan in plans for tile, count in plan})
    if jobs <= 1 or not labels:
        return
    start = time.perf_counter()
    chunks = [(capacity, labels[i::jobs]) for i in range(min(jobs, len(labels)))]
    with multiprocessing.get_context("spawn").Pool(len(chunks)) as pool:
        done = sum(pool.map(_compile_variants, chunks))
    print(f"precompiled {done} of {len(labels)} variants in {len(chunks)} processes "
          f"({time.perf_counter() - start:.1f} s)", flush=True)


def with_capacity(step, capacity_pages: int):
    """The step with every page table widened to `capacity_pages` columns (zeros past the row's pages)."""
    table = torch.zeros(step.page_table.shape[0], capacity_pages, dtype=torch.int32, device=step.page_table.device)
    table[:, : step.page_table.shape[1]] = step.page_table
    return step._replace(page_table=table)


class Case:
    """One (batch, context) shape: its inputs, KV bytes and the reference output (the new kernel)."""

    def __init__(self, config: Config, caches, batch: int, context: int, capacity: int, device):
        step = make_step(config, [1] * batch, [context] * batch, caches[0].shape[0], device)
        self.step = with_capacity(step, -(-capacity // config.page_tokens))
        self.caches, self.batch, self.context = caches, batch, context
        self.bytes = kv_bytes(config, [context] * batch)
        self.scale = config.head_dim ** -0.5

    def args(self):
        return (self.step.q, *self.caches, *self.step[1:], self.scale, 0)


def time_variant(fn, expected: torch.Tensor | None, device, budget: tuple[float, float] | None = None) -> float:
    """Seconds per call of fn() (CUDA graph replays), after checking its output against `expected`.
    budget: do_bench's (warmup, rep) milliseconds (None: its defaults)."""
    got = fn()
    if expected is not None:
        torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
    if budget is None or device.type != "cuda":
        return median_seconds(fn, device, captured=device.type == "cuda")
    import triton.testing

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=budget[0], rep=budget[1], return_mode="median") / 1e3


def sweep(case: Case, decode, plan, expected, device, budget) -> list[dict]:
    """Each (tile, count) of the plan, the grid holding exactly `count` splits (one split: no partials)."""
    rows = []
    for tile, count in plan:
        splits = torch.tensor([count], dtype=torch.int32, device=device)
        try:
            seconds = time_variant(lambda: decode.paged_attention_decode_tuned(
                *case.args(), splits, tile=tile, bound=count), expected, device, budget)
        except Exception as error:  # noqa: BLE001  (a tile the device cannot run is reported, not fatal)
            print(f"  tile {tile.label} splits {count}: {type(error).__name__}: {str(error)[:120]}", flush=True)
            continue
        rows.append({"tile": tile.label, "splits": count, "seconds": seconds})
    return rows


def flashinfer_rows(case: Case, config: Config, expected, device) -> list[dict]:
    """FlashInfer's paged decode on the same pages, or [] with a note when it is absent or fails."""
    try:
        import flashinfer
    except Exception as error:  # noqa: BLE001
        print(f"  flashinfer: not importable ({type(error).__name__}: {str(error)[:80]})", flush=True)
        return []
    pages = -(-case.context // config.page_tokens)
    table = case.step.page_table[:, :pages]
    indptr = torch.arange(0, case.batch + 1, device=device, dtype=torch.int32) * pages
    last = torch.full((case.batch,), case.context - (pages - 1) * config.page_tokens, dtype=torch.int32, device=device)
    rows = []
    for tensor_cores in (True, False):
        try:
            workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
            wrapper.plan(indptr, table.reshape(-1).contiguous(), last, config.num_heads, config.num_kv_heads,
                         config.head_dim, config.page_tokens, pos_encoding_mode="NONE",
                         q_data_type=case.step.q.dtype, kv_data_type=case.caches[0].dtype)
            seconds = time_variant(lambda: wrapper.run(case.step.q, case.caches), expected, device)
            rows.append({"tensor_cores": tensor_cores, "seconds": seconds})
        except Exception as error:  # noqa: BLE001
            print(f"  flashinfer tensor_cores={tensor_cores}: {type(error).__name__}: {str(error)[:160]}", flush=True)
    return rows


def report(label: str, seconds: float, case: Case, copy_rate: float, peak: float, old: float | None) -> dict:
    rate = case.bytes / seconds
    versus = f" {old / seconds:5.2f}x old" if old else ""
    print(f"  {label:<40} {seconds * 1e6:9.1f} us {rate / 1e9:8.1f} GB/s {rate / copy_rate:5.2f}x copy "
          f"{rate / peak:5.2f}x peak{versus}", flush=True)
    return {"label": label, "us": seconds * 1e6, "gb_s": rate / 1e9, "of_copy": rate / copy_rate,
            "of_peak": rate / peak, "vs_old": (old / seconds) if old else None}


def run_case(case: Case, config: Config, modules, args, copy_rate: float, device) -> dict:
    previous, decode = modules
    budget = (args.warmup, args.rep)
    max_context = case.step.page_table.shape[1] * config.page_tokens
    new_splits = decode.decode_splits(case.batch, config.num_kv_heads, max_context, device)
    splits = torch.tensor([new_splits], dtype=torch.int32, device=device)
    expected = decode.paged_attention_decode_tuned(*case.args(), splits)
    print(f"decode b={case.batch} ctx={case.context} ({case.bytes / 1e6:.1f} MB of keys and values)", flush=True)
    old_splits = previous.decode_splits(case.batch, config.num_kv_heads, max_context, device)
    asked_old = torch.tensor([old_splits], dtype=torch.int32, device=device)
    old = time_variant(lambda: previous.paged_attention_decode_tuned(*case.args(), asked_old), expected, device,
                       budget)
    old_tile = previous.decode_tile(case.batch, config.head_dim)
    rows = [report(f"old ({old_splits} splits, tile {old_tile.block_n}x{old_tile.num_warps}x{old_tile.num_stages})",
                   old, case, copy_rate, args.peak, None)]
    tile = decode.decode_tile(case.batch, config.head_dim)
    zero_filled = time_variant(lambda: _zero_filled(decode, case, splits), expected, device, budget)
    new = time_variant(lambda: decode.paged_attention_decode_tuned(*case.args(), splits), expected, device, budget)
    bound = decode.tuned_split_bound(case.batch, config.num_kv_heads, max_context)
    rows.append(report(f"zero fill + new (as before, {tile.label})", zero_filled, case, copy_rate, args.peak, old))
    rows.append(report(f"new ({new_splits} splits of {bound}, tile {tile.label})", new, case, copy_rate, args.peak,
                       old))
    swept = sweep(case, decode, sweep_plan(case.batch, args, decode), expected, device, budget)
    for row in sorted(swept, key=lambda r: r["seconds"])[:3]:
        rows.append(report(f"sweep: tile {row['tile']}, {row['splits']} splits", row["seconds"], case, copy_rate,
                           args.peak, old))
    best = min(swept, key=lambda r: r["seconds"]) if swept else None
    if args.flashinfer and device.type == "cuda":
        for row in flashinfer_rows(case, config, expected, device):
            rows.append(report(f"flashinfer (tensor cores {row['tensor_cores']})", row["seconds"], case, copy_rate,
                               args.peak, old))
    return {"batch": case.batch, "context": case.context, "old_us": old * 1e6, "new_us": new * 1e6,
            "zero_filled_us": zero_filled * 1e6, "rows": rows, "best": best, "sweep": swept}


def _zero_filled(decode, case: Case, splits: torch.Tensor) -> torch.Tensor:
    """The served launch after a zero fill of an output-sized tensor: the decode output's cost before
    the kernel wrote padding tokens' zeros itself (a fill launch per layer)."""
    torch.zeros_like(case.step.q)
    return decode.paged_attention_decode_tuned(*case.args(), splits)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        from helios.abi.triton_interpret import enable_interpreter

        enable_interpreter()
    elif not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    import decode_attention_baseline as old_module
    import decode_attention_previous as previous

    import helios.abi  # noqa: F401  (registers the ops)
    from helios.abi import triton_attention as kernels
    from helios.abi import triton_decode as decode

    config, device = (SMOKE, torch.device("cpu")) if args.smoke else (FULL, torch.device("cuda"))
    if args.smoke:
        args.capacity = 64
        args.tiles = args.tiles or "16x4x2x16x1,16x4x2x16x2,16x4x2x16x0xc,8x4x2x16x1xw,8x4x2x16x1xk2xs"
        args.splits = args.splits or "1,3"
    batches = [int(b) for b in (args.batches or ",".join(map(str, config.batches))).split(",")]
    contexts = [int(c) for c in (args.contexts or ("16,48" if args.smoke else "128,256,1024")).split(",")]
    torch.manual_seed(0)
    print(f"new kernels match the CPU reference (max |error| {check_against_reference(config, kernels, device):.2e})")
    copy_rate = copy_bandwidth(config, device)
    print(f"device copy: {copy_rate / 1e9:.1f} GB/s (read + write); peak {args.peak / 1e9:.0f} GB/s", flush=True)
    longest_prefill = max(new + cached for new, cached in PREFILL_CASES)
    num_pages = max(max(batches) * max(contexts), longest_prefill) // config.page_tokens + 2 * max(batches) + 2
    caches = make_caches(config, num_pages, device)
    if not args.smoke:
        precompile([sweep_plan(b, args, decode) for b in batches], args.capacity, args.jobs)
    cases = [Case(config, caches, b, c, args.capacity, device) for b in batches for c in contexts]
    results = [run_case(case, config, (previous, decode), args, copy_rate, device) for case in cases]
    summarize(results)
    for batch, (label, count) in suggest(results, config, decode, device).items():
        batch_cases = [c for c in cases if c.batch == batch]
        served_with(label, batch_cases, results, decode, args, device)
        capacity = batch_cases[0].step.page_table.shape[1] * config.page_tokens
        if count != decode.decode_splits(batch, config.num_kv_heads, capacity, device):  # the rule asks another
            served_with(f"{label}xn{count}", batch_cases, results, decode, args, device)  # the count, fixed
    prefill = prefill_sweep(config, caches, old_module, kernels, args, device) if args.prefill else []
    if args.json:
        args.json.write_text(json.dumps({"copy_gb_s": copy_rate / 1e9, "cases": results, "prefill": prefill}, indent=1))
    return 0


def prefill_sweep(config: Config, caches, old_module, kernels, args, device) -> list[dict]:
    """The prefill kernel (one row of `new` tokens after `cached` ones) at each tile, against the old
    kernel: microseconds, TFLOP/s of the causal QK and PV products, ratio to old; the best tile."""
    tiles = [kernels.PrefillTile(*map(int, t.split("x"))) for t in args.prefill_tiles.split(",")]
    cases = ((24, 8), (8, 16)) if args.smoke else PREFILL_CASES  # smoke: within the caches' pages
    results, totals = [], {}
    for new, cached in cases:
        step = make_step(config, [new], [new + cached], caches[0].shape[0], device)
        args_ = (step.q, *caches, *step[1:], config.head_dim ** -0.5, 0)
        flops = 4 * config.num_heads * config.head_dim * sum(range(cached + 1, cached + new + 1))
        expected = kernels.paged_attention_prefill(*args_)
        old = time_variant(lambda: old_module.paged_attention_prefill(*args_), expected, device)
        print(f"prefill {new} tokens after {cached} cached: old {old * 1e6:.1f} us ({flops / old / 1e12:.1f} TFLOP/s)",
              flush=True)
        for tile in tiles:
            try:
                seconds = time_variant(lambda: kernels.paged_attention_prefill(*args_, tile=tile), expected,
                                       device)
            except Exception as error:  # noqa: BLE001  (a tile the device cannot run is reported, not fatal)
                print(f"  tile {tile}: {type(error).__name__}: {str(error)[:120]}", flush=True)
                continue
            key = tuple(tile.__dict__.values())
            totals[key] = totals.get(key, 0.0) + seconds
            results.append({"new": new, "cached": cached, "tile": list(key), "us": seconds * 1e6, "old_us": old * 1e6})
            print(f"  tile {'x'.join(map(str, key)):<14} {seconds * 1e6:9.1f} us {flops / seconds / 1e12:6.1f} TFLOP/s "
                  f"{old / seconds:5.2f}x old", flush=True)
    if totals:
        best = min(totals, key=totals.get)
        print(f"suggested PREFILL_TILES[{config.head_dim}] = PrefillTile{best} (summed {totals[best] * 1e6:.1f} us)")
    return results


def summarize(results: list[dict]) -> None:
    """One line per case: old, new and the sweep's best (microseconds) and their ratios."""
    print("summary (us): batch context   old  fill+new   new  best  new/old best/old best/fill+new  best (tile, splits)",
          flush=True)
    for r in results:
        best = r["best"]
        best_us = best["seconds"] * 1e6 if best else float("nan")
        where = f"{best['tile']}, {best['splits']}" if best else "-"
        print(f"  {r['batch']:>5} {r['context']:>7} {r['old_us']:6.1f} {r['zero_filled_us']:8.1f} {r['new_us']:6.1f} "
              f"{best_us:6.1f} {r['old_us'] / r['new_us']:6.2f}x {r['old_us'] / best_us:6.2f}x "
              f"{r['zero_filled_us'] / best_us:9.2f}x   {where}", flush=True)


def suggest(results: list[dict], config: Config, decode, device) -> dict[int, tuple[str, int]]:
    """Per batch: the (tile, split count) whose summed time over the contexts is least, as a
    DECODE_TILES entry, and the DECODE_PROGRAMS_PER_MULTIPROCESSOR whose split rule asks that count.
    Returns the chosen (tile label, split count) by batch (a count the rule does not ask is adopted as
    the tile's fixed count: ``xnN``, `DecodeTile.splits`)."""
    chosen: dict[int, str] = {}
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    for batch in sorted({r["batch"] for r in results}):
        totals: dict[tuple[str, int], float] = {}
        cases = [r for r in results if r["batch"] == batch]
        for result in cases:
            for row in result["sweep"]:
                key = (row["tile"], row["splits"])
                totals[key] = totals.get(key, 0.0) + row["seconds"]
        complete = {key: t for key, t in totals.items()
                    if sum(key in {(x["tile"], x["splits"]) for x in c["sweep"]} for c in cases) == len(cases)}
        if not complete:
            continue
        (label, count), total = min(complete.items(), key=lambda item: item[1])
        programs = batch * config.num_kv_heads
        rule = next((p for p in range(1, 65) if -(-p * sms // programs) >= count), None)
        print(f"suggested DECODE_TILES[({config.head_dim}, {batch})] = DecodeTile.parse({label!r}) with {count} splits "
              f"(summed over contexts {total * 1e6:.1f} us; DECODE_PROGRAMS_PER_MULTIPROCESSOR >= {rule} asks "
              f"{count} at {sms} multiprocessors)", flush=True)
        chosen[batch] = (label, count)
    return chosen


def served_with(label: str, cases: list[Case], results: list[dict], decode, args, device) -> None:
    """The suggested tile as the served path would run it (today's split rule and grid bound, the tile
    in place of the table's), per context, against old and new: what adopting the entry alone gives."""
    tile = decode.DecodeTile.parse(label)
    for case in cases:
        result = next(r for r in results if r["batch"] == case.batch and r["context"] == case.context)
        max_context = case.step.page_table.shape[1] * case.caches[0].shape[1]
        count = decode.decode_splits(case.batch, case.caches[0].shape[2], max_context, device)
        splits = torch.tensor([count], dtype=torch.int32, device=device)
        seconds = time_variant(lambda: decode.paged_attention_decode_tuned(*case.args(), splits, tile=tile), None,
                               device, (args.warmup, args.rep))
        print(f"  served with {label}: b={case.batch} ctx={case.context} {seconds * 1e6:7.1f} us "
              f"({result['old_us'] / (seconds * 1e6):.2f}x old, {result['new_us'] / (seconds * 1e6):.2f}x new; "
              f"{f'{tile.splits} splits, fixed' if tile.splits else f'{count} splits asked'})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
