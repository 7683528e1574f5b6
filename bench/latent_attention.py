"""Absorbed latent decode attention (``helios::paged_latent_attention``) at DeepSeek-V3 shapes.

Latent 512, rotary key 64, bfloat16, pages of 16 tokens; 16 query heads (one rank of eight) and all
128 heads. Checks the CUDA op against the CPU reference on a small batch first, then times (median
of ``triton.testing.do_bench`` over CUDA-graph replays) decode at batches 1/64/256 and contexts
1k/4k. Each line gives the time, the latent bytes the step must read (every row's latents and rotary
keys once), the achieved GB/s and its ratio to a device-to-device copy measured in the same run, and,
where it fits in memory, the ratio to the same attention over up-projected per-head keys and values
(``helios::paged_attention`` reading [pages, 16, H, 192] planes: what a cache without the latent
would read).

    .venv/bin/python bench/latent_attention.py
    .venv/bin/python bench/latent_attention.py --smoke   # tiny shapes, Triton interpreter, CPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import NamedTuple

import torch


class Config(NamedTuple):
    heads: tuple[int, ...]
    latent: int
    rope: int
    page_tokens: int
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    copy_elements: int


FULL = Config((16, 128), 512, 64, 16, (1, 64, 256), (1024, 4096), 1 << 28)
SMOKE = Config((4,), 32, 16, 4, (1, 3), (16, 40), 1 << 16)
DTYPE = torch.bfloat16
EXPANDED_LIMIT = 8 << 30  # bytes of up-projected keys/values the peer may allocate


def inputs(config: Config, heads: int, rows: int, context: int, device, dtype=DTYPE):
    pages_per_row = -(-context // config.page_tokens)
    num_pages = rows * pages_per_row
    table = torch.randperm(num_pages, device=device)[:num_pages].view(rows, pages_per_row).to(torch.int32)
    return dict(
        q_latent=torch.randn(rows, heads, config.latent, device=device, dtype=dtype),
        q_rope=torch.randn(rows, heads, config.rope, device=device, dtype=dtype),
        latent_cache=torch.randn(num_pages, config.page_tokens, config.latent, device=device, dtype=dtype),
        rope_cache=torch.randn(num_pages, config.page_tokens, config.rope, device=device, dtype=dtype),
        page_table=table, query_start=torch.arange(rows + 1, device=device, dtype=torch.int32),
        positions=torch.full((rows,), context - 1, device=device, dtype=torch.int64), scale=0.07)


def timed(call, smoke: bool) -> float:
    """Seconds per call: a CUDA graph's replays (median of do_bench); wall time in smoke mode."""
    if smoke:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start
    import triton.testing

    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return triton.testing.do_bench(graph.replay, return_mode="median") / 1e3


def copy_bandwidth(config: Config, device, smoke: bool) -> float:
    source = torch.empty(config.copy_elements, device=device)
    target = torch.empty_like(source)
    seconds = statistics.median(timed(lambda: target.copy_(source), smoke) for _ in range(3))
    return 2 * source.numel() * 4 / seconds


def expanded_peer(config: Config, args: dict, heads: int):
    """The same attention over per-head keys [.., H, Dn + Dr] and values, through paged_attention."""
    pages = args["latent_cache"].shape[0]
    width = 128 + config.rope
    keys = torch.randn(pages, config.page_tokens, heads, width, device=args["q_latent"].device, dtype=DTYPE)
    values = torch.randn_like(keys)
    q = torch.randn(args["q_latent"].shape[0], heads, width, device=keys.device, dtype=DTYPE)
    return lambda: torch.ops.helios.paged_attention(q, keys, values, args["page_table"], args["query_start"],
                                                    args["positions"], 0.07, 0)


def check(config: Config, device) -> None:
    args = inputs(config, config.heads[0], 3, 37, device, torch.float32)
    ours = torch.ops.helios.paged_latent_attention(**args).cpu()
    reference = torch.ops.helios.paged_latent_attention(
        **{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in args.items()})
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)
    print("check: the device op equals the CPU reference")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    options = parser.parse_args(argv)
    if options.smoke:
        from helios.abi.triton_interpret import enable_interpreter

        enable_interpreter()
    import helios.abi.attention  # noqa: F401
    import helios.abi.latent_attention  # noqa: F401
    from helios.abi import triton_latent

    config, device = (SMOKE, torch.device("cpu")) if options.smoke else (FULL, torch.device("cuda"))
    ops = torch.ops.helios
    call_op = triton_latent.triton_paged_latent_attention if options.smoke else ops.paged_latent_attention
    if not options.smoke:
        check(config, device)
    bandwidth = copy_bandwidth(config, device, options.smoke)
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write)")
    for heads in config.heads:
        for rows in config.batches:
            for context in config.contexts:
                args = inputs(config, heads, rows, context, device)
                seconds = timed(lambda: call_op(**args), options.smoke)
                read = rows * context * (config.latent + config.rope) * 2
                rate = read / seconds
                line = (f"heads {heads:3d} batch {rows:3d} context {context:5d}: {seconds * 1e6:9.1f} us, "
                        f"{read / 1e6:8.1f} MB, {rate / 1e9:7.1f} GB/s, {rate / bandwidth:.2f}x copy")
                expanded = rows * context * heads * (128 + config.rope) * 2 * 2
                if not options.smoke and expanded <= EXPANDED_LIMIT:
                    peer = timed(expanded_peer(config, args, heads), options.smoke)
                    line += f", {peer / seconds:.2f}x faster than up-projected keys/values"
                print(line)
                del args
    return 0


if __name__ == "__main__":
    sys.exit(main())
