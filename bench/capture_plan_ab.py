"""The capture plans (`cuda_graphs.plan_captures`) built on the CPU from programs loaded as the CUDA
path loads them (`programs.load_program` on the meta device, no GPU needed).

Default: `cuda_graphs._plan` against the rewrites applied one by one as before it (each rewrite
copying its input's graph and generating its code), same process, alternated; prints both times and
whether every captured module's code is the same.

``--plans``: `plan_captures` over every program as `load_model` calls it (code generated lazily),
``--rounds`` times in one process; prints each round's seconds, how many torch.fx graph deep copies it
made and their seconds, and a digest of every planned module's graph and code (equal digests: the
same graphs). Run it from two trees (``PYTHONPATH=OTHER/src``) in alternated fresh processes for an
A/B of a change to the plans. ``--skinny-64`` first gives the core's MLP projections a skinny tile
at 64 rows, as `helios.abi.gemv_tiles` does for Llama-3.1-8B's (on an 8B core the decode-64 programs
bind them, and `gemv_module` rewrites their graphs); the study core's width has no tile otherwise.

    python bench/capture_plan_ab.py /tmp/core32 --prepare       # a 32-layer core of the smoke width (CPU, ~1 min)
    python bench/capture_plan_ab.py /tmp/core32 --plans [--skinny-64] [--rounds 3]
    python bench/cold_start.py --medium --layers 32 --variants logprobs --skip-no-logprobs-load \\
        --keep-core /tmp/medcore                      # a 32-layer, 2048-wide study core (CPU)
    python bench/capture_plan_ab.py /tmp/medcore --accept bench/gpu [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import sys
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


def prepare(core_dir: Path, layers: int) -> None:
    """A core of `layers` layers of the smoke width with cold_start's capacities (the 8B core's programs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cold_start import NAMESPACE, plan_for
    from random_llama import SMOKE, with_layers, write_random_llama

    from helios.core.keys import SigningKey, write_key_pair
    from helios.ignition.export import PrepareOptions, prepare_core

    core_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = write_random_llama(core_dir / "checkpoint", with_layers(SMOKE, layers), torch.bfloat16)
    key = SigningKey.generate()
    prepare_core(checkpoint, core_dir / "model.core", key,
                 PrepareOptions(NAMESPACE, dtype="bfloat16", capacities=plan_for(2048, True, False, None)))
    write_key_pair(core_dir / "publisher.key", key, [NAMESPACE])


class GraphCopies(contextlib.ContextDecorator):
    """Counts and times `copy.deepcopy` of torch.fx graphs within the block."""

    def __init__(self):
        self.count, self.seconds = 0, 0.0

    def __enter__(self):
        self._real = real = torch.fx.Graph.__deepcopy__

        def counted(graph, memo=None):
            started = time.perf_counter()
            try:
                return real(graph, memo)
            finally:
                self.count += 1
                self.seconds += time.perf_counter() - started

        torch.fx.Graph.__deepcopy__ = counted
        return self

    def __exit__(self, *exc) -> None:
        torch.fx.Graph.__deepcopy__ = self._real


def digest(plans) -> str:
    """A digest of every planned module's graph and generated code, in plan order."""
    hashed = hashlib.sha256()
    for plan in plans.plans.values():
        for module in plan.modules():
            hashed.update(f"{plan.name}\n{module.graph}\n{module.code}\n".encode())
    return hashed.hexdigest()[:16]


def give_skinny_tiles(programs) -> None:
    """The 8B table's two skinny tiles, at 64 rows, keyed by this core's gate/up and down shapes (read
    from a program's graph: the projection whose one reader is ``helios::silu_mul``)."""
    from helios.abi import gemv_tiles

    silu_mul = torch.ops.helios.silu_mul.default
    gate_up = next(tuple(node.args[1].meta["val"].shape) for program in programs for node in program.module.graph.nodes
                   if node.target is torch.ops.aten.linear.default and [u.target for u in node.users] == [silu_mul])
    gate_up_tile, down_tile = gemv_tiles.SKINNY_TILES.values()
    gemv_tiles.SKINNY_TILES.update({(64, *gate_up): gate_up_tile, (64, gate_up[1], gate_up[0] // 2): down_tile})


def time_plans(programs, rounds: int) -> None:
    import helios

    device = torch.device("meta")
    print(f"helios from {Path(helios.__file__).parent}; {len(programs)} programs")
    for index in range(rounds):
        with GraphCopies() as copies:
            started = time.perf_counter()
            plans = cuda_graphs.plan_captures(programs, device)
            seconds = time.perf_counter() - started
        modules = sum(len(plan.modules()) for plan in plans.plans.values())
        print(f"round {index}: plans {seconds:.2f} s, {modules} planned modules, {copies.count} graph deep copies "
              f"({copies.seconds:.2f} s), digest {digest(plans)}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("core_dir", type=Path, help="folder with model.core and publisher.key.pub (--keep-core)")
    parser.add_argument("--accept", default="bench/gpu", help="the core's publisher namespace")
    parser.add_argument("--concurrency", type=int, default=256, help="the load's request slots (selects programs)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prepare", action="store_true", help="write the study core into core_dir first")
    parser.add_argument("--layers", type=int, default=32, help="--prepare: its layers")
    parser.add_argument("--plans", action="store_true", help="time plan_captures and count its graph copies")
    parser.add_argument("--skinny-64", action="store_true", help="--plans: skinny tiles for the core's MLP at 64 rows")
    args = parser.parse_args(argv)
    if args.prepare:
        prepare(args.core_dir, args.layers)
    core = open_core(args.core_dir / "model.core", accept=args.accept,
                     trusted_keys=[load_public_key(args.core_dir / "publisher.key.pub")])
    prepared, device = core.prepared, torch.device("meta")
    declared = DeclaredOps({op.name: op.schema for op in prepared.manifest.abi_operations}, registered_schemas())
    programs = [load_program(core, prepared, h, declared, device, lazy_code=args.plans)
                for h in select_handles(prepared, args.concurrency)]
    if args.plans:
        if args.skinny_64:
            give_skinny_tiles(programs)
        time_plans(programs, args.rounds)
        return 0
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
