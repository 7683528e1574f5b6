"""Triton paged-attention kernels at Llama-3.1-8B attention shapes: time, KV bytes read, bandwidth.

Shapes: 32 query heads, 8 key/value heads, head_dim 128, bfloat16, pages of 16 tokens. First checks
``helios::paged_attention`` on CUDA (the Triton kernels) against the CPU reference on a small mixed
batch and ``helios::cache_write`` against its reference, then times (median of
``triton.testing.do_bench``) decode at batches 1/64/256 and contexts 1k/4k/8k with the split on
(``--split``, default: the kernel's own choice) and off (one split), and a 2048-token prefill.
Each call is captured in a CUDA graph and the graph's replays are timed (``--eager``: the calls).
Each line gives the time, the bytes of keys and values the step must read, the achieved GB/s and
its ratio to a device-to-device copy measured in the same run (read + write bytes).

    .venv/bin/python bench/attention_kernels.py [--split N] [--prefill-tokens 2048]
    .venv/bin/python bench/attention_kernels.py --smoke   # tiny shapes, Triton interpreter, CPU

Every row of a case has the same context; pages are a random permutation of the cache's pages.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, NamedTuple

import torch


class Config(NamedTuple):
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_tokens: int
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    copy_elements: int  # float32 elements of the copy-bandwidth buffers


FULL = Config(32, 8, 128, 16, (1, 64, 256), (1024, 4096, 8192), 1 << 28)
SMOKE = Config(4, 2, 32, 4, (1, 3), (16, 48), 1 << 16)
DTYPE = torch.bfloat16


class Step(NamedTuple):
    """One attention call's inputs besides the caches."""

    q: torch.Tensor
    page_table: torch.Tensor
    query_start: torch.Tensor
    positions: torch.Tensor


def make_step(config: Config, query_lens: list[int], contexts: list[int], num_pages: int,
              device: torch.device) -> Step:
    """Rows of `query_lens` new tokens ending at `contexts`, on distinct random pages."""
    pages = [-(-context // config.page_tokens) for context in contexts]
    order = torch.randperm(num_pages, device=device)[: sum(pages)].to(torch.int32)
    page_table = torch.zeros(len(contexts), max(pages), dtype=torch.int32, device=device)
    for row, start in enumerate(torch.tensor([0] + pages).cumsum(0)[:-1].tolist()):
        page_table[row, : pages[row]] = order[start:start + pages[row]]
    positions = [p for new, context in zip(query_lens, contexts) for p in range(context - new, context)]
    q = torch.randn(len(positions), config.num_heads, config.head_dim, device=device, dtype=DTYPE)
    query_start = torch.tensor([0] + query_lens, device=device).cumsum(0).to(torch.int32)
    return Step(q, page_table, query_start, torch.tensor(positions, device=device))


def make_caches(config: Config, num_pages: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_pages, config.page_tokens, config.num_kv_heads, config.head_dim)
    return torch.randn(shape, device=device, dtype=DTYPE), torch.randn(shape, device=device, dtype=DTYPE)


def check_against_reference(config: Config, kernels, device: torch.device) -> float:
    """Largest |kernels - CPU reference| on a small mixed batch (prefill kernel) and a decode batch
    (decode kernel, split); raises AssertionError past 2e-2 or when cache_write differs. On CUDA the
    kernels are reached through the ops (their CUDA registration); on the CPU, the launchers."""
    on_cuda = device.type == "cuda"
    attend = torch.ops.helios.paged_attention if on_cuda else kernels.triton_paged_attention
    write = torch.ops.helios.cache_write if on_cuda else kernels.triton_cache_write
    caches = make_caches(config, 256, device)
    scale, error = config.head_dim ** -0.5, 0.0
    for query_lens, contexts in (([1, 5, 1, 12], [40, 17, 3, 60]), ([1, 1, 1], [300, 7, 129])):
        step = make_step(config, query_lens, contexts, 256, device)
        got = attend(step.q, *caches, *step[1:], scale, 8).float().cpu()
        cpu = [t.cpu() for t in (step.q, *caches, *step[1:])]
        expected = torch.ops.helios.paged_attention(*cpu, scale, 8).float()
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
        error = max(error, float((got - expected).abs().max()))
    k = torch.randn(6, config.num_kv_heads, config.head_dim, device=device, dtype=DTYPE)
    slots = torch.tensor([5, -1, 70, 0, -1, 11], device=device)
    written = [c.clone() for c in caches]
    write(*written, k, k, slots)
    expected_caches = [c.cpu() for c in caches]
    torch.ops.helios.cache_write(*expected_caches, k.cpu(), k.cpu(), slots.cpu())
    assert all(torch.equal(w.cpu(), e) for w, e in zip(written, expected_caches)), "cache_write differs"
    return error


def median_seconds(fn: Callable[[], object], device: torch.device, captured: bool = True) -> float:
    """Median run time: triton.testing.do_bench on CUDA (of a CUDA graph replaying `fn` when
    `captured`, as a captured program runs it: no Python launch overhead), wall clock elsewhere."""
    if device.type == "cuda":
        import triton.testing

        if captured:
            fn()  # compiles the kernels outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            fn = graph.replay
        return triton.testing.do_bench(fn, return_mode="median") / 1e3
    fn()
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def copy_bandwidth(config: Config, device: torch.device) -> float:
    """Device-to-device copy bytes per second, counting the read and the write."""
    source = torch.empty(config.copy_elements, device=device)
    target = torch.empty_like(source)
    seconds = median_seconds(lambda: target.copy_(source), device)
    return 2 * source.numel() * source.element_size() / seconds


def kv_bytes(config: Config, contexts: list[int]) -> int:
    """Bytes of keys and values a step must read: every row's context, both planes."""
    return 2 * sum(contexts) * config.num_kv_heads * config.head_dim * torch.finfo(DTYPE).bits // 8


def report(name: str, seconds: float, num_bytes: int, copy_rate: float, extra: str = "") -> None:
    rate = num_bytes / seconds
    print(f"{name:<34} {seconds * 1e6:10.1f} us {num_bytes / 1e6:10.3f} MB {rate / 1e9:9.1f} GB/s "
          f"{rate / copy_rate:6.2f}x copy {extra}", flush=True)


def bench_decode(config: Config, kernels, caches, split: int | None, copy_rate: float,
                 device: torch.device, captured: bool) -> None:
    num_pages = caches[0].shape[0]
    scale = config.head_dim ** -0.5
    for batch in config.batches:
        for context in config.contexts:
            step = make_step(config, [1] * batch, [context] * batch, num_pages, device)
            num_bytes = kv_bytes(config, [context] * batch)
            max_context = step.page_table.shape[1] * config.page_tokens
            for label, value in (("split", split), ("no split", 1)):
                asked = value or kernels.decode_splits(batch, config.num_kv_heads, max_context, device)
                splits = kernels.grid_splits(max_context, asked, kernels.decode_tile(batch, config.head_dim).block_n)
                seconds = median_seconds(lambda: kernels.triton_paged_attention(
                    step.q, *caches, *step[1:], scale, 0, split=value), device, captured)
                report(f"decode b={batch} ctx={context} {label}", seconds, num_bytes, copy_rate,
                       f"({splits} splits)")


def bench_prefill(config: Config, kernels, caches, num_tokens: int, copy_rate: float,
                  device: torch.device, captured: bool) -> None:
    step = make_step(config, [num_tokens], [num_tokens], caches[0].shape[0], device)
    scale = config.head_dim ** -0.5
    seconds = median_seconds(lambda: kernels.triton_paged_attention(step.q, *caches, *step[1:], scale, 0),
                             device, captured)
    flops = 4 * config.num_heads * config.head_dim * num_tokens * (num_tokens + 1) // 2  # causal QK and PV
    report(f"prefill {num_tokens} tokens", seconds, kv_bytes(config, [num_tokens]), copy_rate,
           f"{flops / seconds / 1e12:.1f} TFLOP/s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on the CPU under Triton's interpreter (checks the script runs)")
    parser.add_argument("--split", type=int, default=None,
                        help="decode splits for the 'split' lines (default: the kernel's choice)")
    parser.add_argument("--eager", action="store_true",
                        help="time eager launches (default: replays of a CUDA graph of each call)")
    parser.add_argument("--prefill-tokens", type=int, default=None, help="prefill length (default 2048; smoke 24)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        from helios.abi.triton_interpret import enable_interpreter

        enable_interpreter()  # before anything imports triton
    elif not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    import helios.abi  # noqa: F401  (registers the ops)
    from helios.abi import triton_attention as kernels

    config, device = (SMOKE, torch.device("cpu")) if args.smoke else (FULL, torch.device("cuda"))
    prefill_tokens = args.prefill_tokens or (24 if args.smoke else 2048)
    torch.manual_seed(0)
    error = check_against_reference(config, kernels, device)
    print(f"kernels on {device.type} match the CPU reference (max |error| {error:.2e})")
    copy_rate = copy_bandwidth(config, device)
    print(f"device copy: {copy_rate / 1e9:.1f} GB/s (read + write)")
    num_pages = max(max(config.batches) * max(config.contexts), prefill_tokens) // config.page_tokens + 1
    caches = make_caches(config, num_pages, device)
    split = args.split if args.split or not args.smoke else 3  # smoke contexts are too short to split
    bench_decode(config, kernels, caches, split, copy_rate, device, not args.eager)
    bench_prefill(config, kernels, caches, prefill_tokens, copy_rate, device, not args.eager)
    return 0


if __name__ == "__main__":
    sys.exit(main())
