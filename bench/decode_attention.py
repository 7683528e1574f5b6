"""Decode attention at Llama-3.1-8B shapes: the old kernel against the new one (and FlashInfer's decode
where the ``flashinfer`` package imports), a sweep of tiles and split counts, and the fraction of the
memory-bandwidth roofline each reaches.

Shapes: 32 query heads, 8 key/value heads, head_dim 128, bfloat16, pages of 16, a capacity context of
``--capacity`` positions (as a serving capacity: every row's page table has that many columns), batches
1/64/256 and contexts 256/1k/4k (every row of a case has that context). Each call is captured in a
CUDA graph and its replays timed (median of ``triton.testing.do_bench``). Rows:

- ``old``: `bench/decode_attention_baseline.py` (the kernel before splits cut each token's own span),
  with the split count its tuning rule gave (2 programs per multiprocessor, capacity cut);
- ``new``: ``helios::paged_attention_tuned``'s decode path as served (the tuning rule's split count,
  the tile from `decode_tile`);
- ``best``: the fastest tile and split count of the sweep (``--tiles``, ``--splits``);
- ``flashinfer``: BatchDecodeWithPagedKVCacheWrapper (NHD pages, tensor cores on and off), if present.

Each row prints microseconds, the bytes of keys and values read, GB/s, that rate over the device copy
rate measured in the same run (read + write; about the achievable roofline) and over ``--peak`` (the
datasheet bandwidth), and the ratio against ``old``. Every variant's output is checked against the new
kernel's (and the new kernel's against the CPU reference on a small batch) before it is timed. The
last lines suggest `helios.abi.triton_decode.DECODE_TILES` entries.

    python bench/decode_attention.py [--json out.json] [--batches 1,64,256] [--contexts 256,1024,4096]
    python bench/decode_attention.py --smoke   # tiny shapes, Triton interpreter, CPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_kernels import FULL, SMOKE, Config, copy_bandwidth, kv_bytes, make_caches, make_step  # noqa: E402
from attention_kernels import check_against_reference, median_seconds  # noqa: E402

TILES = "32x4x2,64x4x2,64x8x2,128x4x2,128x8x2,128x8x3"  # block_n x num_warps x num_stages
# block_pairs x block_n x num_warps x num_stages
PREFILL_TILES = "64x64x4x2,128x64x4x2,128x64x8x2,128x64x8x3,128x128x8x2,256x64x8x3,64x128x4x3"
PREFILL_CASES = ((2048, 0), (208, 1840), (512, 0))  # (new tokens, cached tokens) of one row


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script runs)")
    parser.add_argument("--batches", default=None)
    parser.add_argument("--contexts", default=None)
    parser.add_argument("--capacity", type=int, default=4112, help="capacity context (page-table width x 16)")
    parser.add_argument("--tiles", default=TILES)
    parser.add_argument("--splits", default="1,2,4,8,16")
    parser.add_argument("--peak", type=float, default=4.8e12, help="datasheet bytes/s (H200: 4.8 TB/s)")
    parser.add_argument("--no-flashinfer", action="store_true")
    parser.add_argument("--prefill", action="store_true", help="also sweep the prefill kernel's tiles")
    parser.add_argument("--prefill-tiles", default=PREFILL_TILES)
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def old_splits(batch: int, config: Config, capacity: int, sms: int) -> int:
    """The old tuning rule: 2 programs per multiprocessor, one split per 256 capacity positions."""
    return max(1, min(-(-2 * sms // (batch * config.num_kv_heads)), -(-capacity // 256), 64))


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


def time_variant(fn, expected: torch.Tensor | None, device) -> float:
    """Seconds per call of fn() (CUDA graph replays), after checking its output against `expected`."""
    got = fn()
    if expected is not None:
        torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
    return median_seconds(fn, device, captured=device.type == "cuda")


def sweep(case: Case, decode, tiles, split_counts, expected, device) -> list[dict]:
    rows = []
    max_context = case.step.page_table.shape[1] * case.caches[0].shape[1]
    for tile in tiles:
        counts = [s for s in split_counts if s <= decode.grid_splits(max_context, s, tile.block_n)]
        for count in counts:  # the grid holds exactly `count` splits (one split: no partials, no combine)
            splits = torch.tensor([count], dtype=torch.int32, device=device)
            try:
                seconds = time_variant(lambda: decode.paged_attention_decode_tuned(
                    *case.args(), splits, tile=tile, bound=count), expected, device)
            except Exception as error:  # noqa: BLE001  (a tile the device cannot run is reported, not fatal)
                print(f"  tile {tile} splits {count}: {type(error).__name__}: {str(error)[:120]}", flush=True)
                continue
            rows.append({"tile": list(tile.__dict__.values()), "splits": count, "seconds": seconds})
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
    old_module, decode = modules
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    max_context = case.step.page_table.shape[1] * config.page_tokens
    new_splits = decode.decode_splits(case.batch, config.num_kv_heads, max_context, device)
    expected = decode.paged_attention_decode_tuned(*case.args(), torch.tensor([new_splits], dtype=torch.int32,
                                                                                device=device))
    print(f"decode b={case.batch} ctx={case.context} ({case.bytes / 1e6:.1f} MB of keys and values)", flush=True)
    asked_old = torch.tensor([old_splits(case.batch, config, max_context, sms)], dtype=torch.int32, device=device)
    old = time_variant(lambda: old_module.paged_attention_decode_tuned(*case.args(), asked_old), expected, device)
    rows = [report(f"old ({int(asked_old)} splits asked)", old, case, copy_rate, args.peak, None)]
    splits = torch.tensor([new_splits], dtype=torch.int32, device=device)
    tile = decode.decode_tile(case.batch, config.head_dim)
    new = time_variant(lambda: decode.paged_attention_decode_tuned(*case.args(), splits), expected, device)
    rows.append(report(f"new ({new_splits} splits, tile {tile.block_n}x{tile.num_warps}x{tile.num_stages})",
                       new, case, copy_rate, args.peak, old))
    if tile != decode.DEFAULT_TILE:  # the table's entry against the default tile, same split count
        plain = time_variant(lambda: decode.paged_attention_decode_tuned(*case.args(), splits,
                                                                         tile=decode.DEFAULT_TILE), expected, device)
        rows.append(report(f"new, default tile {'x'.join(map(str, decode.DEFAULT_TILE.__dict__.values()))}",
                           plain, case, copy_rate, args.peak, old))
    tiles = [decode.DecodeTile(*map(int, t.split("x"))) for t in args.tiles.split(",")]
    swept = sweep(case, decode, tiles, [int(s) for s in args.splits.split(",")], expected, device)
    best = min(swept, key=lambda r: r["seconds"]) if swept else None
    if best:
        rows.append(report(f"best (tile {'x'.join(map(str, best['tile']))}, {best['splits']} splits)",
                           best["seconds"], case, copy_rate, args.peak, old))
    if not args.no_flashinfer and device.type == "cuda":
        for row in flashinfer_rows(case, config, expected, device):
            rows.append(report(f"flashinfer (tensor cores {row['tensor_cores']})", row["seconds"], case, copy_rate,
                               args.peak, old))
    return {"batch": case.batch, "context": case.context, "rows": rows, "best": best, "sweep": swept}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        from helios.abi.triton_interpret import enable_interpreter

        enable_interpreter()
    elif not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    import decode_attention_baseline as old_module

    import helios.abi  # noqa: F401  (registers the ops)
    from helios.abi import triton_attention as kernels
    from helios.abi import triton_decode as decode

    config, device = (SMOKE, torch.device("cpu")) if args.smoke else (FULL, torch.device("cuda"))
    if args.smoke:
        args.capacity, args.tiles, args.splits = 64, "16x4x2", "1,3"
    batches = [int(b) for b in (args.batches or ",".join(map(str, config.batches))).split(",")]
    contexts = [int(c) for c in (args.contexts or ("16,48" if args.smoke else "256,1024,4096")).split(",")]
    torch.manual_seed(0)
    print(f"new kernels match the CPU reference (max |error| {check_against_reference(config, kernels, device):.2e})")
    copy_rate = copy_bandwidth(config, device)
    print(f"device copy: {copy_rate / 1e9:.1f} GB/s (read + write); peak {args.peak / 1e9:.0f} GB/s", flush=True)
    longest_prefill = max(new + cached for new, cached in PREFILL_CASES)
    num_pages = max(max(batches) * max(contexts), longest_prefill) // config.page_tokens + 2 * max(batches) + 2
    caches = make_caches(config, num_pages, device)
    results = [run_case(Case(config, caches, b, c, args.capacity, device), config, (old_module, decode), args,
                        copy_rate, device) for b in batches for c in contexts]
    suggest(results, config)
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


def suggest(results: list[dict], config: Config) -> None:
    """Per batch: the tile whose summed time over the contexts is least (the table's key is the batch)."""
    for batch in sorted({r["batch"] for r in results}):
        per_tile: dict[tuple, float] = {}
        for result in (r for r in results if r["batch"] == batch):
            for key in {tuple(row["tile"]) for row in result["sweep"]}:
                best = min(x["seconds"] for x in result["sweep"] if tuple(x["tile"]) == key)
                per_tile[key] = per_tile.get(key, 0.0) + best
        if per_tile:
            tile = min(per_tile, key=per_tile.get)
            print(f"suggested DECODE_TILES[({config.head_dim}, {batch})] = DecodeTile{tile} "
                  f"(summed best over contexts {per_tile[tile] * 1e6:.1f} us)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
