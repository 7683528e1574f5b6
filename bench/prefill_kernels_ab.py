"""The kernels of a 2,048-token cold prefill at Llama-3.1-8B shapes, each against its alternatives
in one process: where the prefill's device time could still go down.

- GEMMs at M = 2,048 (fused qkv, o_proj, fused gate/up, down_proj) as the programs run them
  (``F.linear`` on [out, in] weights through cuBLAS), against cuBLASLt (``preferred_blas_library``),
  against [in, out] weights (``x @ w``, the other operand layout), against the swapped product
  ``w @ x^T`` (its output transposed: what a consumer reading [out, tokens] would allow; the tile
  grid then runs along the weight's rows) and against TunableOp's pick
  after tuning the shape: us and TFLOP/s each, and the 32-layer sum of the served choice against
  the best per shape;
- the fused gate/up product and silu_mul as served against the swapped product ``w @ x^T`` that
  the column-major silu_mul kernel reads in place (`helios.abi.triton_fused`), at M and M / 4;
- the same GEMMs at decode batch sizes (``--decode-rows``): what a global BLAS choice does there;
- the prefill attention kernel's long tiles (`helios.abi.triton_prefill_tiles.LONG_PREFILL_TILES`)
  on consecutive pages (a cold prompt on a run of pages, `helios.runtime.cache.pages`) and on
  shuffled pages: the served tile against the other descriptor tiles.

Each timing is the median of ``triton.testing.do_bench`` over a CUDA graph of the call.

    python bench/prefill_kernels_ab.py [--layers 32] [--json out.json]
    python bench/prefill_kernels_ab.py --smoke   # tiny shapes on the CPU (checks the script runs)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_kernels import FULL, SMOKE, make_caches, median_seconds  # noqa: E402

# (name, in features, out features) of one Llama-3.1-8B layer's GEMMs as the prepared programs fuse them
GEMMS = (("qkv", 4096, 6144), ("o_proj", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096))
SMOKE_GEMMS = (("qkv", 64, 96), ("o_proj", 64, 64), ("gate_up", 64, 256), ("down", 128, 64))
TILES = ("ht128x128x8x3", "ht128x64x8x3", "ht64x64x4x3", "ht64x64x4x4", "ht128x64x8x4", "ht64x128x4x3",
         "ht64x64x8x3", "ht128x128x8x4", "ht64x32x4x3")
SMOKE_TILES = ("ht16x16x2x1x16", "h16x16x2x1x16")


def gemm_rows(shapes, tokens: int, device: torch.device, tunable: bool = False) -> list[dict]:
    """us and TFLOP/s of each GEMM shape per variant (`tunable`: also TunableOp's pick, timed
    uncaptured, after it tuned the shape)."""
    rows = []
    for name, k, n in shapes:
        x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        w_kn = w.t().contiguous()
        variants = [("linear (cuBLAS)", lambda: F.linear(x, w), None), ("x @ w[in, out]", lambda: x @ w_kn, None)]
        if device.type == "cuda":
            variants.append(("linear (cuBLASLt)", lambda: F.linear(x, w), "cublaslt"))
            if tunable:  # the prefill size only: also the swapped product, whose output is [out, tokens]
                variants.append(("w @ x^T [out, M]", lambda: torch.mm(w, x.t()), None))
                variants.append(("linear (TunableOp)", lambda: F.linear(x, w), "tunable"))
        flops = 2 * tokens * k * n
        row = {"gemm": name, "in": k, "out": n, "us": {}}
        for label, fn, backend in variants:
            try:
                seconds = _timed(fn, device, backend)
            except Exception as error:  # noqa: BLE001  (a variant the device cannot run is reported)
                print(f"  {name:<8} {label:<18} failed: {type(error).__name__}: {str(error)[:120]}", flush=True)
                continue
            row["us"][label] = seconds * 1e6
            print(f"  {name:<8} {tokens}x{k}x{n} {label:<18} {seconds * 1e6:8.1f} us "
                  f"{flops / seconds / 1e12:6.1f} TFLOP/s", flush=True)
        rows.append(row)
        del x, w, w_kn
    return rows


def _timed(fn, device: torch.device, backend: str | None) -> float:
    """Median seconds of fn in a CUDA graph, captured under BLAS `backend` (None: the default);
    "tunable": TunableOp tunes the shape first, then fn runs uncaptured."""
    if backend == "tunable":
        import triton.testing

        tunable = torch.cuda.tunable
        tunable.set_filename(str(Path(tempfile.gettempdir()) / "prefill_kernels_ab_tunableop.csv"))  # not the tree
        tunable.enable(True)
        tunable.tuning_enable(True)
        try:
            fn()
            tunable.tuning_enable(False)
            fn()
            return triton.testing.do_bench(fn, return_mode="median") / 1e3
        finally:
            tunable.tuning_enable(False)
            tunable.enable(False)
    if backend is None:
        return median_seconds(fn, device, captured=device.type == "cuda")
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(backend)
    try:
        return median_seconds(fn, device, captured=True)
    finally:
        torch.backends.cuda.preferred_blas_library(previous)


def swapped_mlp_rows(k: int, n: int, token_counts, layers: int, device: torch.device) -> list[dict]:
    """gate/up product + silu_mul as served (F.linear, row-major silu_mul) against the swapped
    product w @ x^T read in place by the column-major silu_mul kernel: us per layer, ms x layers."""
    ops = torch.ops.helios
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
    rows = []
    for tokens in token_counts:
        x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
        served = lambda: ops.silu_mul(F.linear(x, w))  # noqa: E731
        swapped = lambda: ops.silu_mul(torch.mm(w, x.t()).t())  # noqa: E731
        torch.testing.assert_close(swapped(), served(), rtol=2e-2, atol=2e-2)
        times = {label: median_seconds(fn, device, captured=device.type == "cuda")
                 for label, fn in (("served", served), ("swapped", swapped))}
        print(f"  gate_up + silu_mul at M={tokens}: served {times['served'] * 1e6:8.1f} us, swapped "
              f"{times['swapped'] * 1e6:8.1f} us ({(times['served'] - times['swapped']) * layers * 1e3:+.2f} ms "
              f"x {layers} layers saved)", flush=True)
        rows.append({"tokens": tokens, "served_us": times["served"] * 1e6, "swapped_us": times["swapped"] * 1e6})
    return rows


def gemm_summary(rows: list[dict], layers: int) -> dict:
    served = sum(row["us"]["linear (cuBLAS)"] for row in rows) * layers / 1e3
    best = sum(min(row["us"].values()) for row in rows) * layers / 1e3
    print(f"GEMMs x {layers} layers: served {served:.2f} ms, best variant per shape {best:.2f} ms "
          f"({served - best:.2f} ms to gain)", flush=True)
    return {"served_ms": served, "best_ms": best}


def attention_rows(config, tiles, tokens: int, layers: int, device: torch.device) -> list[dict]:
    """The long tiles on consecutive and shuffled pages: us per layer and the 32-layer ms."""
    from prefill_attention import Case, precompile, rule_splits

    from helios.abi import triton_prefill as prefill
    from helios.abi.triton_prefill_tiles import LONG_PREFILL_TILES, parse_tile

    capacity = tokens + 64
    if device.type == "cuda":  # Triton compiles in processes side by side, into its cache
        max_context = -(-capacity // config.page_tokens) * config.page_tokens
        precompile([f"{name}:{rule_splits(parse_tile(name), config, tokens, max_context, prefill, device)}"
                    for name in tiles], capacity, min(len(tiles), 12))
    caches = make_caches(config, -(-capacity // config.page_tokens) + 64, device)
    served = LONG_PREFILL_TILES.get(config.head_dim)
    rows = []
    for consecutive in (True, False):
        case = Case(config, caches, (tokens, 0, tokens, consecutive), capacity, device)
        print(f"prefill attention, {case.label()}:", flush=True)
        for name in tiles:
            tile = parse_tile(name)
            try:
                seconds = _checked(case, tile, device)
            except Exception as error:  # noqa: BLE001  (a tile the device cannot run is reported, not fatal)
                print(f"  {name:<16} failed: {type(error).__name__}: {str(error)[:160]}", flush=True)
                continue
            mark = " (served)" if served is not None and tile == served else ""
            print(f"  {name:<16} {seconds * 1e6:8.1f} us per layer, {seconds * layers * 1e3:6.2f} ms x {layers}"
                  f"{mark}", flush=True)
            rows.append({"tile": name, "consecutive": consecutive, "us": seconds * 1e6, "served": bool(mark)})
    return rows


def _checked(case, tile, device: torch.device) -> float:
    from helios.abi import triton_prefill as prefill

    fn = lambda: prefill.paged_attention_prefill(*case.args(), tile=tile)  # noqa: E731
    got = fn()
    torch.testing.assert_close(got.float().cpu(), case.expected, rtol=2e-2, atol=2e-2)
    return median_seconds(fn, device, captured=device.type == "cuda")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=None, help="prompt tokens (default 2048; smoke 24)")
    parser.add_argument("--decode-rows", default="1,64,256", help="decode batch sizes of the GEMM rows")
    parser.add_argument("--no-tunable", action="store_true", help="skip TunableOp's row at the prefill size")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        from helios.abi.triton_interpret import enable_interpreter

        enable_interpreter()
    import helios.abi  # noqa: F401  (registers the ops the reference checks use)

    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    tokens = args.tokens or (24 if args.smoke else 2048)
    torch.manual_seed(0)
    results = {"tokens": tokens, "layers": args.layers}
    shapes = SMOKE_GEMMS if args.smoke else GEMMS
    k, n = shapes[2][1:]  # the adoption candidates first (a cut run keeps them), then the survey
    print("gate/up product and silu_mul, served against swapped:", flush=True)
    results["swapped_mlp"] = swapped_mlp_rows(k, n, [tokens, tokens // 4], args.layers, device)
    results["attention"] = attention_rows(SMOKE if args.smoke else FULL, SMOKE_TILES if args.smoke else TILES, tokens,
                                          args.layers, device)
    print(f"GEMMs at M={tokens}:", flush=True)
    results["gemms"] = gemm_rows(shapes, tokens, device, tunable=not args.no_tunable)
    results["gemm_summary"] = gemm_summary(results["gemms"], args.layers)
    results["decode_gemms"] = {}
    for rows in (int(r) for r in args.decode_rows.split(",") if r):  # what a global BLAS choice does to decode
        print(f"GEMMs at M={rows} (decode):", flush=True)
        results["decode_gemms"][rows] = gemm_rows(shapes, rows, device)
        gemm_summary(results["decode_gemms"][rows], args.layers)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
