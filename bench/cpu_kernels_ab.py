"""Same-process A/B of the compiled CPU programs' C++ kernels (not a test): one engine loaded with
its programs compiled (`--compile-programs`), generating the same greedy workload alternately with
each program's attention calls, cache writes and sampling calls on the kernels built at load
(`helios.runtime.loading.decode_attention_kernel`, `cache_write_kernel`, `greedy_kernel`) and on
the bodies they replace (`helios.abi.cpu_bodies.attention_planned`: page gathers and SDPA over the
padded context, over `plan_attention`'s plan; `cache_write_planned`: two ``index_copy_`` calls;
`sample_rows_gathering`: the numpy greedy decision and torch's argmax). --only
attention|writes|sampling swaps one of them (the others stay on their kernels).

Prints thread CPU time per step (prefill included, as `bench/cpu_step_profile.py` counts it) of
each side, best and median of --repeats alternated runs (the order swapped every round), their
ratio, whether both sides gave the same tokens, and the load average.

    .venv/bin/python bench/cpu_kernels_ab.py [--model embedded|llama4] [--batch 16]
        [--tokens 64] [--repeats 7] [--only attention|writes|sampling]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from cpu_step_profile import _engine  # noqa: E402

from helios.abi import cpu_bodies  # noqa: E402
from helios.abi.paged_reference import plan_attention  # noqa: E402
from helios.runtime.loading.cpu_programs import CpuProgram  # noqa: E402
from helios.runtime.offline import generate  # noqa: E402


REFERENCES = {"decode_attention_kernel": lambda target: cpu_bodies.attention_planned,
              "plan_tokens": lambda target: plan_attention,
              "cache_write_kernel": lambda target: cpu_bodies.cache_write_planned,
              "greedy_sample_kernel": lambda target: target.body}
ONLY = {"attention": ("decode_attention_kernel", "plan_tokens"), "writes": ("cache_write_kernel",),
        "sampling": ("greedy_sample_kernel",)}


def _kernel_nodes(engine, names) -> list:
    """(module, node) for every kernel-bound call (by the bodies' names) of the compiled programs."""
    found = []
    for program in engine.executor.model.programs:
        module = getattr(program.module, "compiled", None) if isinstance(program.module, CpuProgram) else None
        if module is None:
            continue
        found += [(module, node) for node in module.graph.nodes
                  if node.op == "call_function" and getattr(node.target, "__name__", "") in names]
    return found


def _use(nodes: list, targets: list) -> None:
    modules = {}
    for (module, node), target in zip(nodes, targets):
        node.target = target
        modules[id(module)] = module
    for module in modules.values():
        module.recompile()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", choices=("embedded", "llama4"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", choices=tuple(ONLY), help="swap one kernel only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        engine = _engine(args.model, args.batch, args.tokens, Path(scratch), compiled=True)
        prompts = [[(b * 13 + i) % 500 + 3 for i in range(8)] for b in range(args.batch)]
        nodes = _kernel_nodes(engine, ONLY[args.only] if args.only else tuple(REFERENCES))
        sides = {"kernel": [node.target for _, node in nodes],
                 "reference": [REFERENCES[node.target.__name__](node.target) for _, node in nodes]}
        times: dict[str, list[float]] = {side: [] for side in sides}
        tokens = {}
        for side, targets in sides.items():  # warm-up, and the tokens
            _use(nodes, targets)
            tokens[side] = [list(getattr(r, "token_ids", r)) for r in generate(engine, prompts, args.tokens)]
        order = list(sides)
        for _ in range(args.repeats):
            for side in order:
                _use(nodes, sides[side])
                started = time.thread_time()
                generate(engine, prompts, args.tokens)
                times[side].append((time.thread_time() - started) / (args.tokens + 1))
            order.reverse()
        _use(nodes, sides["kernel"])
        print(f"{args.model}, batch {args.batch}, {args.tokens} tokens, compiled programs ({len(nodes)} calls swapped: "
              f"{args.only or 'attention, writes and sampling'}): thread CPU per step, {args.repeats} alternated runs each; same tokens: "
              f"{tokens['kernel'] == tokens['reference']}; load average {os.getloadavg()[0]:.1f}")
        for side, values in times.items():
            print(f"  {side:9s} best {1e6 * min(values):7.0f} us  median {1e6 * statistics.median(values):7.0f} us")
        print(f"  kernel / reference: best {min(times['kernel']) / min(times['reference']):.3f}, "
              f"median {statistics.median(times['kernel']) / statistics.median(times['reference']):.3f}")


if __name__ == "__main__":
    main()
