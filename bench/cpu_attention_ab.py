"""The CPU attention kernel (`helios.runtime.loading.decode_attention_kernel`) against its previous
form, same process, alternated: a decode step's attention call
at several shapes, one thread, the planes written once (warm in the caches after the first rounds,
as the microsecond figures of a step profile are not). Each side's output is checked against the
reference `attend` first. The previous form is the same source with groups of one or two query
heads sent down the path every group took before (one reduction per key's score, the values a
vector of the head at a time), which the source keeps for larger groups. Prints microseconds per call (best of --rounds alternated rounds of
--calls calls), nanoseconds per (key, key/value head), and the ratio current / previous.

With --engine, the same in a serving engine instead: the model's core prepared and loaded with the
CPU kernels (`bench/cpu_step_profile.py`'s engine), the same greedy batch generated alternately with
every decode and prompt program's attention calls on each kernel (swapped in the fast graphs), thread
CPU time per step (prefill included), best and median of --repeats runs each, and whether both
sides gave the same tokens.

    python bench/cpu_attention_ab.py [--rounds 15] [--calls 100] [--threads 1] [--shapes llama4,embedded,...]
    python bench/cpu_attention_ab.py --engine llama4|embedded [--batch 16] [--tokens 64] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_step_profile import _engine  # noqa: E402

from helios.abi.paged_reference import attend, plan_attention  # noqa: E402
from helios.runtime.loading import decode_attention_kernel as current  # noqa: E402
from helios.runtime.loading.cpp_kernels import build_cpp_kernel  # noqa: E402

BLOCKED = "if constexpr (G == 1 || G == 2)"  # the source's choice of the blocked path
assert current.KERNEL_SOURCE.count(BLOCKED) == 1, "the attention source no longer chooses its path this way"
PREVIOUS_SOURCE = current.KERNEL_SOURCE.replace(BLOCKED, "if constexpr (false)")

# name: (rows, query heads, key/value heads, head size, context); pages of 16 tokens
SHAPES = {
    "llama4-b16": (16, 8, 4, 32, 96),  # bench/random_llama.py's SMOKE shape, as generate_vs_hf's llama4
    "llama4-b1": (1, 8, 4, 32, 96),
    "embedded-b16": (16, 4, 2, 32, 96),  # the embedded default model
    "embedded-b16-long": (16, 4, 2, 32, 512),
    "g1-d64": (16, 4, 4, 64, 200),
    "g2-d128": (8, 8, 4, 128, 150),
    "g4-d128": (4, 32, 8, 128, 300),  # Llama-3.1-8B's heads
    "g4-d64": (8, 16, 4, 64, 150),
    "g8-d32": (16, 16, 2, 32, 150),
    "g7-d40": (5, 14, 2, 40, 77),
}
PAGE_TOKENS = 16


def step_inputs(rows: int, q_heads: int, kv_heads: int, head_dim: int, context: int, seed: int = 0):
    """q, planes, page table, row bounds and positions of a decode step (rows' pages shuffled)."""
    generator = torch.Generator().manual_seed(seed)
    pages = -(-(context + 1) // PAGE_TOKENS)
    plane_pages = rows * pages + 4
    shape = (plane_pages, PAGE_TOKENS, kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    table = torch.randperm(plane_pages, generator=generator)[:rows * pages].view(rows, pages).to(torch.int32)
    positions = torch.tensor([context - row % 7 for row in range(rows)])
    q = torch.randn(rows, q_heads, head_dim, generator=generator)
    return q, k_cache, v_cache, table.contiguous(), torch.arange(rows + 1, dtype=torch.int32), positions


def alternated(first, second, calls: int, rounds: int) -> tuple[float, float]:
    """Best microseconds per call of each, rounds alternated (order swapped every round)."""
    for _ in range(10):
        first(), second()
    times = ([], [])
    for index in range(rounds):
        order = ((0, first), (1, second)) if index % 2 == 0 else ((1, second), (0, first))
        for side, call in order:
            started = time.perf_counter()
            for _ in range(calls):
                call()
            times[side].append((time.perf_counter() - started) / calls * 1e6)
    return min(times[0]), min(times[1])


def engine_ab(model: str, batch: int, tokens: int, repeats: int) -> None:
    """The engine A/B (see the module docstring)."""
    from helios.runtime.loading.cpu_programs import CpuProgram
    from helios.runtime.offline import generate

    previous_kernel = build_cpp_kernel(current._ARGUMENT_TYPES, PREVIOUS_SOURCE)
    with tempfile.TemporaryDirectory() as scratch:
        engine = _engine(model, batch, tokens, Path(scratch))
        sites = [(program.module.fast, node) for program in engine.executor.model.programs
                 if isinstance(program.module, CpuProgram) and program.module.fast is not None
                 for node in program.module.fast.graph.nodes
                 if getattr(node.target, "__name__", "") == "decode_attention_kernel"]
        if not sites:
            raise SystemExit("no attention call is bound to the kernel (no C++ compiler?)")
        sides = {"current": [node.target for _, node in sites],
                 "previous": [current.decode_attention(previous_kernel) for _ in sites]}  # a body per call site

        def use(side: str) -> None:
            for (_, node), target in zip(sites, sides[side]):
                node.target = target
            for module in {id(m): m for m, _ in sites}.values():
                module.recompile()

        prompts = [[(b * 13 + i) % 500 + 3 for i in range(8)] for b in range(batch)]
        produced, times = {}, {side: [] for side in sides}
        for side in sides:  # warm-up, and the tokens
            use(side)
            produced[side] = [list(getattr(r, "token_ids", r)) for r in generate(engine, prompts, tokens)]
        order = list(sides)
        for _ in range(repeats):
            for side in order:
                use(side)
                started = time.thread_time()
                generate(engine, prompts, tokens)
                times[side].append((time.thread_time() - started) / (tokens + 1))
            order.reverse()
        use("current")
    print(f"{model}, batch {batch}, {tokens} tokens, {len(sites)} attention calls swapped: thread CPU per step, "
          f"{repeats} alternated runs each; same tokens: {produced['current'] == produced['previous']}; "
          f"load average {os.getloadavg()[0]:.1f}")
    for side, values in times.items():
        print(f"  {side:9s} best {1e6 * min(values):7.0f} us  median {1e6 * statistics.median(values):7.0f} us")
    print(f"  current / previous: best {min(times['current']) / min(times['previous']):.3f}, "
          f"median {statistics.median(times['current']) / statistics.median(times['previous']):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names: " + ", ".join(SHAPES))
    parser.add_argument("--engine", choices=("embedded", "llama4"), help="A/B in a serving engine of this model")
    parser.add_argument("--batch", type=int, default=16, help="--engine: requests generated together")
    parser.add_argument("--tokens", type=int, default=64, help="--engine: tokens per request")
    parser.add_argument("--repeats", type=int, default=7, help="--engine: alternated runs per side")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.engine:
        engine_ab(args.engine, args.batch, args.tokens, args.repeats)
        return
    previous = current.decode_attention(build_cpp_kernel(current._ARGUMENT_TYPES, PREVIOUS_SOURCE))
    now = current.decode_attention(current.build_kernel())
    print(f"{'shape':18s} {'rows x Hq/Hkv x D, context':28s} {'previous us':>11s} {'current us':>10s} "
          f"{'ns/key-head':>11s} {'current/previous':>16s}")
    for name in args.shapes.split(","):
        if name not in SHAPES:
            raise SystemExit(f"unknown shape {name!r}; one of {', '.join(SHAPES)}")
        rows, q_heads, kv_heads, head_dim, context = SHAPES[name]
        q, k_cache, v_cache, table, bounds, positions = step_inputs(*SHAPES[name])
        step = current.plan_tokens(table, bounds, positions, 0, k_cache)
        scale = head_dim ** -0.5
        expected = attend(plan_attention(table, bounds, positions, 0, k_cache), q, k_cache, v_cache, scale)
        for body in (previous, now):
            torch.testing.assert_close(body(q, k_cache, v_cache, step, scale), expected, rtol=1e-5, atol=1e-6)
        before, after = alternated(lambda: previous(q, k_cache, v_cache, step, scale),
                                   lambda: now(q, k_cache, v_cache, step, scale), args.calls, args.rounds)
        key_heads = int((positions + 1).sum()) * kv_heads
        print(f"{name:18s} {f'{rows} x {q_heads}/{kv_heads} x {head_dim}, {context}':28s} {before:11.1f} "
              f"{after:10.1f} {after * 1e3 / key_heads:11.2f} {after / before:16.3f}", flush=True)


if __name__ == "__main__":
    main()
