"""The capture's graph-variant building (`cuda_graphs._plan`) against the rewrites applied one by one
as before it (each rewrite copying its input's graph and generating its code), same process,
alternated, on programs built as the CUDA path builds them (`programs.load_program` on the meta
device, no GPU needed). Prints both times and whether every captured module's code is the same.

    python bench/cold_start.py --medium --layers 32 --variants logprobs --skip-no-logprobs-load \\
        --keep-core /tmp/medcore                      # a 32-layer, 2048-wide study core (CPU)
    python bench/capture_plan_ab.py /tmp/medcore --accept bench/gpu [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from helios.abi.registry import registered_schemas
from helios.core.keys import load_public_key
from helios.core.reader import open_core
from helios.runtime.loading import cuda_graphs
from helios.runtime.loading.model import select_handles
from helios.runtime.loading.programs import DeclaredOps, load_program


def one_by_one(program, device) -> list:
    """The captured modules as built before `_plan`: every rewrite copies and generates its code."""
    module = cuda_graphs.gemv_module(cuda_graphs.rotary_module(program.module))
    main = cuda_graphs._graph_variants(module, program, device, owned=False)
    fresh = cuda_graphs.fresh_module(module) if cuda_graphs.wants_fresh_graph(program) else None
    fresh = cuda_graphs._graph_variants(fresh, program, device, owned=False) if fresh is not None else ()
    return [m.code for m in (*main, *fresh) if m is not None]


def planned(program, device) -> list:
    plan = cuda_graphs._plan(program, device)
    return [m.code for m in (*plan.main, *(plan.fresh or ())) if m is not None]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("core_dir", type=Path, help="folder with model.core and publisher.key.pub (--keep-core)")
    parser.add_argument("--accept", default="bench/gpu", help="the core's publisher namespace")
    parser.add_argument("--concurrency", type=int, default=256, help="the load's request slots (selects programs)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    core = open_core(args.core_dir / "model.core", accept=args.accept,
                     trusted_keys=[load_public_key(args.core_dir / "publisher.key.pub")])
    prepared, device = core.prepared, torch.device("meta")
    declared = DeclaredOps({op.name: op.schema for op in prepared.manifest.abi_operations}, registered_schemas())
    programs = [load_program(core, prepared, h, declared, device) for h in select_handles(prepared, args.concurrency)]
    ratios = []
    for index in range(args.rounds):
        order = (one_by_one, planned) if index % 2 == 0 else (planned, one_by_one)
        seconds, codes = {}, {}
        for build in order:
            started = time.perf_counter()
            codes[build.__name__] = [build(program, device) for program in programs]
            seconds[build.__name__] = time.perf_counter() - started
        ratios.append(seconds["planned"] / seconds["one_by_one"])
        graphs = sum(len(c) for c in codes["planned"])
        print(f"round {index}: {len(programs)} programs, {graphs} captured modules: one by one "
              f"{seconds['one_by_one']:.2f} s, planned {seconds['planned']:.2f} s ({ratios[-1]:.2f}x); "
              f"same code: {codes['planned'] == codes['one_by_one']}")
    print(f"median planned / one by one: {sorted(ratios)[len(ratios) // 2]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
