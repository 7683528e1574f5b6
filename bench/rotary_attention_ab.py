"""Per layer, at Llama-3.1-8B attention shapes: the rotary cache write and the decode attention as two
launches (``helios::rotary_cache_write``'s kernel, then the tuned decode kernel, as a captured step ran
them) against one launch of ``helios::rotary_paged_attention`` (the decode kernel with its rotary
prologue), in one process on the same inputs.

Shapes: 32 query heads, 8 key/value heads, head_dim 128, bf16, pages of 16; q, k, v views of one fused
[T, 6144] product (as a program's qkv split); each row one new token at ``--contexts`` positions; the
split count the tuning rule gives (`decode_splits`) in the tuned launch; the served tile table. A CUDA
graph holds one call per layer over `layers` distinct cache planes (as many of 32 as fit 2 GB: the
other layers' planes and weights keep L2 cold in a served step) and its replays are timed (median);
the line prints microseconds per layer of each form and their ratio. Before timing, the two forms'
outputs and written planes are compared bit for bit (they must be equal).

    python bench/rotary_attention_ab.py [--batches 1,64,256] [--contexts 128,256,1024] [--json out.json]
    python bench/rotary_attention_ab.py --smoke   # tiny shapes under Triton's interpreter (the script runs)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_kernels import FULL, SMOKE, Config, make_caches, make_step  # noqa: E402

if not torch.cuda.is_available():
    from helios.abi.triton_interpret import enable_interpreter

    enable_interpreter()

import lever_ab  # noqa: E402
from helios.abi import rotary_attention  # noqa: E402,F401  (registers the op)
from helios.abi import triton_decode as decode  # noqa: E402
from helios.abi.rotary_attention import triton_rotary_paged_attention  # noqa: E402
from helios.abi.triton_fused import triton_rotary_cache_write  # noqa: E402

PLANES_BYTES = 2 << 30


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--contexts", default="128,256,1024")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true")
    return parser.parse_args(argv)


def layer_inputs(config: Config, batch: int, context: int, layers: int, device: torch.device):
    """(q, k, v, cos, sin, slots, geometry, planes): one step's inputs and `layers` plane pairs."""
    pages = batch * -(-context // config.page_tokens) + 1
    step = make_step(config, [1] * batch, [context] * batch, pages, device)
    dim, heads, kv_heads = config.head_dim, config.num_heads, config.num_kv_heads
    fused = torch.randn(batch, (heads + 2 * kv_heads) * dim, device=device, dtype=torch.bfloat16)
    q, k, v = fused.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = q.view(batch, heads, dim), k.view(batch, kv_heads, dim), v.view(batch, kv_heads, dim)
    angles = step.positions[:, None].float() * torch.rand(dim // 2, device=device)[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = (t.to(torch.bfloat16)[:, None, :] for t in (angles.cos(), angles.sin()))
    pos = step.positions
    slots = (step.page_table[torch.arange(batch, device=device), pos // config.page_tokens].long()
             * config.page_tokens + pos % config.page_tokens)
    planes = [make_caches(config, pages, device) for _ in range(layers)]
    return (q, k, v, cos, sin, slots, (step.page_table, step.query_start, step.positions), planes)


def measure(config: Config, batch: int, context: int, device: torch.device, replays: int) -> dict:
    plane_bytes = 2 * batch * context * config.num_kv_heads * config.head_dim * 2
    layers = max(1, min(32 if device.type == "cuda" else 2, PLANES_BYTES // max(plane_bytes, 1)))
    q, k, v, cos, sin, slots, geometry, planes = layer_inputs(config, batch, context, layers, device)
    max_context = geometry[0].shape[1] * config.page_tokens
    splits = torch.tensor([decode.decode_splits(batch, config.num_kv_heads, max_context, device)],
                          dtype=torch.int32, device=device)
    scale = config.head_dim ** -0.5

    def two(k_cache, v_cache, weight=None):
        rotated = triton_rotary_cache_write(q, k, v, cos, sin, k_cache, v_cache, slots)
        out = decode.paged_attention_decode_tuned(rotated, k_cache, v_cache, *geometry, scale, 0, splits)
        return out if weight is None else F.linear(out.view(batch, -1), weight)

    def one(k_cache, v_cache, weight=None, prefetch=False):
        out = triton_rotary_paged_attention(q, k, v, cos, sin, k_cache, v_cache, slots, *geometry, scale, 0, None,
                                            splits, prefetch=weight if prefetch else None)
        return out if weight is None else F.linear(out.view(batch, -1), weight)

    def hinted(k_cache, v_cache, weight=None):  # (the interpreter runs no inline assembly: not prefetched there)
        return one(k_cache, v_cache, weight, prefetch=device.type == "cuda")

    first = planes[0]
    copies = [(first[0].clone(), first[1].clone()) for _ in range(2)]
    outputs = [form(*pair) for form, pair in zip((two, one), copies)]
    equal = torch.equal(outputs[0], outputs[1]) and all(torch.equal(a, b) for a, b in zip(*copies))
    del copies, outputs
    timed = {}
    for name, form in (("two", two), ("one", one)):
        timed[name] = 1e3 * lever_ab.graph_ms(lambda: [form(*pair) for pair in planes], replays=replays) / layers
    # with each layer's output projection (distinct 4096 x 4096 weights: cold in L2), the fused launch with
    # and without the L2 prefetch of that weight
    weights = [torch.randn(config.num_heads * config.head_dim, config.num_heads * config.head_dim, device=device,
                           dtype=torch.bfloat16) * 0.02 for _ in range(32 if device.type == "cuda" else 1)]
    projected = [(pair, weights[index % len(weights)]) for index, pair in enumerate(planes)]
    for name, form in (("two+o", two), ("one+o", one), ("one+o prefetch", hinted)):
        timed[name] = 1e3 * lever_ab.graph_ms(lambda: [form(*pair, weight) for pair, weight in projected],
                                              replays=replays) / layers
    row = {"batch": batch, "context": context, "layers": layers, "splits": int(splits.item()),
           "two_launches_us": timed["two"], "one_launch_us": timed["one"], "equal": equal,
           "speedup": timed["two"] / timed["one"], "with_o_us": {k: v for k, v in timed.items() if "+o" in k}}
    print(f"rotary+attention B={batch:<4} ctx={context:<5} two launches {timed['two']:7.2f} us/layer, one launch "
          f"{timed['one']:7.2f} us/layer ({row['speedup']:.3f}x, saves {timed['two'] - timed['one']:.2f} us/layer, "
          f"{32 * (timed['two'] - timed['one']) / 1e3:.3f} ms per 32-layer step); {layers} layers' planes; "
          f"outputs and planes bit for bit equal: {equal}", flush=True)
    print(f"rotary+attention+o B={batch:<4} ctx={context:<5} two launches + o {timed['two+o']:7.2f} us/layer, one "
          f"launch + o {timed['one+o']:7.2f}, one launch prefetching o's weight + o {timed['one+o prefetch']:7.2f} "
          f"({timed['one+o'] / timed['one+o prefetch']:.3f}x from the prefetch)", flush=True)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    on_cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if on_cuda else "cpu")
    config = FULL if on_cuda else SMOKE
    batches = [int(b) for b in args.batches.split(",")] if on_cuda else [1, 3]
    contexts = [int(c) for c in args.contexts.split(",")] if on_cuda else [16]
    rows = [measure(config, batch, context, device, args.replays if on_cuda else 2)
            for batch in batches for context in contexts]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(row["equal"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
