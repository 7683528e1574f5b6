"""Where a decode attention call's time goes at the anchor's shapes: a fixed cost per call and a cost
per cached position, from a sweep of contexts (not a test).

Shapes: Llama-3.1-8B (32 query heads, 8 key/value heads, head_dim 128, bfloat16, pages of 16). For
each batch, every row at the same context, ``--layers`` calls on distinct caches (as a step's layers
read distinct planes) are captured in one CUDA graph and replayed; a call's time is the replay over
the layers. Rows per batch and context:

- ``plain``: ``helios::paged_attention``'s decode path (the tile `decode_tile` picks, one split);
- ``served``: the rotary-fused launch a served decode step makes (``helios::rotary_paged_attention``:
  the queries rotated as loaded, this step's key and value written by the programs that read them);
- ``after qkv``: the served launch behind the layer's qkv product (``F.linear`` [R, 4096] x [4096,
  6144]) in the same graph, less the products alone: what the call adds to a step, L2 traffic and the
  boundary between the two kernels included.

A least-squares line through the contexts (``--fit-from`` and up) splits each row into a fixed cost
per call (the intercept: launch, the programs' chain of dependent loads before their first keys,
epilogue, tail) and a marginal cost per position (reported as the bandwidth of the keys and values it
reads). ``empty`` is a Triton kernel with the served launch's grid that returns at once: the launch
and scheduling part of the fixed cost.

``--pdl-contexts``: at those contexts, the served launch behind the qkv product with and without
programmatic dependent launch (`helios.abi.triton_decode`'s PDL: its programs may be placed while
the product finishes and wait for it first thing), with the served tile and with its speculating
form (``s``); each output is compared with the same tile's without it. (Session 32 call 2 also
timed a form that loaded the position, the rows' bounds and the first page entries before the
wait: no faster than waiting first, 0.7-1.4 us against 0.4-1.4 us saved a call.)

    python bench/decode_fixed_cost.py [--batches 1,64,256] [--contexts 1,16,64,128,192,256,512,1024] [--json out.json]
    python bench/decode_fixed_cost.py --smoke   # tiny shapes, Triton interpreter, CPU (checks the script runs)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_kernels import DTYPE, FULL, SMOKE, kv_bytes, make_caches, make_step  # noqa: E402
from lever_ab import graph_ms  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--contexts", default="1,16,64,128,192,256,512,1024")
    parser.add_argument("--layers", type=int, default=8, help="calls a graph holds, each on its own caches")
    parser.add_argument("--fit-from", type=int, default=64, help="smallest context in the least-squares line")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--pdl-contexts", default="128,256", help="contexts of the dependent-launch A/B; '' for none")
    parser.add_argument("--json", default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script runs)")
    return parser.parse_args(argv)


def graph_us(calls, replays: int) -> float:
    """Median microseconds of one replay of a CUDA graph of `calls` (`lever_ab.graph_ms`: run once
    first, outside it); on the CPU (`--smoke`), wall time."""
    return graph_ms(lambda: [call() for call in calls], replays=replays) * 1e3


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(intercept us, slope us per position) of the least-squares line through `points`."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else 0.0
    return mean_y - slope * mean_x, slope


def _empty_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def empty(out):
        if tl.program_id(0) < 0:  # never: a program that returns at once
            tl.store(out, 0)

    return empty


class Layers:
    """`layers` decode calls' inputs at (batch, context): distinct caches and steps per layer (every row
    one new token at position `context`, on its own pages), the qkv product's input and weights, and
    the rotary launch's new keys, values, rotation and slots."""

    def __init__(self, config, batch: int, context: int, layers: int, device):
        self.config, self.batch, self.count = config, batch, layers
        self.scale = config.head_dim ** -0.5
        pages = batch * -(-(context + 1) // config.page_tokens) + 1
        self.caches = [make_caches(config, pages, device) for _ in range(layers)]
        self.steps = [make_step(config, [1] * batch, [context + 1] * batch, pages, device) for _ in range(layers)]
        hidden, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.x = torch.randn(batch, hidden, device=device, dtype=DTYPE)
        self.weights = [torch.randn(hidden + 2 * kv, hidden, device=device, dtype=DTYPE) * 0.02 for _ in range(layers)]
        self.k_new = torch.randn(batch, config.num_kv_heads, config.head_dim, device=device, dtype=DTYPE)
        self.v_new = torch.randn_like(self.k_new)
        self.cos = torch.randn(batch, config.head_dim, device=device, dtype=DTYPE)
        self.sin = torch.randn_like(self.cos)
        rows = torch.arange(batch, device=device)
        self.slots = []  # each row's new token at its last position
        for step in self.steps:
            position = step.positions.to(torch.int64)
            page = step.page_table[rows, position // config.page_tokens].to(torch.int64)
            self.slots.append(page * config.page_tokens + position % config.page_tokens)

    def plain(self, i):
        from helios.abi.triton_decode import paged_attention_decode

        step = self.steps[i]
        return lambda: paged_attention_decode(step.q, *self.caches[i], step.page_table, step.query_start,
                                              step.positions, self.scale, 0)

    def served(self, i, **options):
        """The rotary-fused launch of layer i (`options`: tile, pdl)."""
        from helios.abi.rotary_attention import triton_rotary_paged_attention

        step = self.steps[i]
        return lambda: triton_rotary_paged_attention(
            step.q, self.k_new, self.v_new, self.cos, self.sin, *self.caches[i], self.slots[i], step.page_table,
            step.query_start, step.positions, self.scale, 0, **options)

    def qkv(self, i):
        return lambda: F.linear(self.x, self.weights[i])

    def us(self, calls, replays: int) -> float:
        """Microseconds a layer of `calls` (a list over the layers) in one graph."""
        return graph_us(calls, replays) / self.count

    def after_qkv_us(self, replays: int, products_us: float, **options) -> float:
        """The served launch's microseconds a layer behind the layer's qkv product, less the product."""
        both = [call for i in range(self.count) for call in (self.qkv(i), self.served(i, **options))]
        return self.us(both, replays) - products_us

    def close(self) -> None:
        self.caches = self.steps = self.weights = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def case_rows(config, batch: int, context: int, layers: int, replays: int, device) -> dict:
    """The plain, served and after-qkv microseconds of one call at (batch, context)."""
    case = Layers(config, batch, context, layers, device)
    row = {"batch": batch, "context": context, "kv_mb": kv_bytes(config, [context] * batch) / 1e6}
    row["plain_us"] = case.us([case.plain(i) for i in range(layers)], replays)
    row["served_us"] = case.us([case.served(i) for i in range(layers)], replays)
    row["qkv_us"] = case.us([case.qkv(i) for i in range(layers)], replays)
    row["after_qkv_us"] = case.after_qkv_us(replays, row["qkv_us"])
    case.close()
    return row


def pdl_rows(config, batch: int, context: int, layers: int, replays: int, device) -> list[dict]:
    """After-qkv microseconds of the served launch per (tile, dependent launch or not), and whether its
    outputs equal the launch without it (the same tile's, bit for bit)."""
    from dataclasses import replace

    from helios.abi.decode_tiles import decode_tile

    case = Layers(config, batch, context, layers, device)
    served = decode_tile(batch, config.head_dim)
    tiles = {"served": served, "speculating": replace(served, speculate=True)}
    products = case.us([case.qkv(i) for i in range(layers)], replays)
    rows = []
    for label, tile in tiles.items():
        expected = case.served(0, tile=tile, pdl=False)()
        for pdl in (False, True):
            same = bool(torch.equal(case.served(0, tile=tile, pdl=pdl)(), expected))
            rows.append({"batch": batch, "context": context, "tile": label, "pdl": pdl, "same_bits": same,
                         "after_qkv_us": case.after_qkv_us(replays, products, tile=tile, pdl=pdl)})
    case.close()
    return rows


def empty_us(config, batch: int, layers: int, replays: int, device) -> float:
    """One launch of a do-nothing Triton kernel with the served decode grid at `batch` (k4 tiles: two
    programs a token at 8 key/value heads; one split)."""
    from helios.abi.decode_tiles import decode_tile

    tile = decode_tile(batch, config.head_dim)
    programs = -(-config.num_kv_heads // tile.heads_per_program(config.num_kv_heads))
    kernel = _empty_kernel()
    out = torch.zeros(1, device=device)
    return graph_us([lambda: kernel[(batch, programs, 1)](out, num_warps=tile.num_warps)] * layers, replays) / layers


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        from helios.abi.triton_interpret import enable_interpreter

        enable_interpreter()  # before anything imports triton
        args.batches, args.contexts, args.layers, args.fit_from = "1,3", "4,8,16", 2, 4
        args.pdl_contexts = ""  # programmatic dependent launch needs the device
    elif not torch.cuda.is_available():
        print("decode_fixed_cost: needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    config = SMOKE if args.smoke else FULL
    device = torch.device("cpu" if args.smoke else "cuda")
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    rows, summary = [], []
    for batch in batches:
        launch = empty_us(config, batch, args.layers, args.replays, device)
        print(f"batch {batch}: empty kernel with the served grid {launch:.2f} us a launch", flush=True)
        per_batch = []
        for context in contexts:
            row = case_rows(config, batch, context, args.layers, args.replays, device)
            per_batch.append(row)
            print(f"batch {batch:4d} context {context:5d} ({row['kv_mb']:8.1f} MB): plain {row['plain_us']:7.1f} us, "
                  f"served {row['served_us']:7.1f} us, after qkv {row['after_qkv_us']:7.1f} us "
                  f"(qkv alone {row['qkv_us']:6.1f})", flush=True)
        bytes_per_position = kv_bytes(config, [1] * batch)
        entry = {"batch": batch, "empty_us": launch}
        for kind in ("plain", "served", "after_qkv"):
            points = [(r["context"], r[f"{kind}_us"]) for r in per_batch if r["context"] >= args.fit_from]
            if len(points) < 2:
                continue
            fixed, slope = fit(points)
            entry[kind] = {"fixed_us": fixed, "us_per_position": slope,
                           "marginal_tb_s": bytes_per_position / (slope * 1e-6) / 1e12 if slope > 0 else None}
            rate = entry[kind]["marginal_tb_s"]
            print(f"batch {batch} {kind}: fixed {fixed:.1f} us a call + {slope:.4f} us a position"
                  + (f" ({rate:.2f} TB/s of keys and values at the margin)" if rate else ""), flush=True)
        pdl = []
        for context in [int(c) for c in args.pdl_contexts.split(",") if c]:
            pdl.extend(pdl_rows(config, batch, context, args.layers, args.replays, device))
        base = {(r["tile"], r["context"]): r["after_qkv_us"] for r in pdl if not r["pdl"]}
        for r in pdl:
            print(f"batch {batch} context {r['context']} {r['tile']} tile, PDL {'on' if r['pdl'] else 'off'}: after "
                  f"qkv {r['after_qkv_us']:.1f} us ({base[(r['tile'], r['context'])] - r['after_qkv_us']:+.1f} us "
                  f"saved; outputs {'the same bits' if r['same_bits'] else 'DIFFER'})", flush=True)
        entry["pdl"] = pdl
        summary.append(entry)
        rows.extend(per_batch)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
