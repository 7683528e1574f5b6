"""What keeps the Triton precompile's stand-in weights referenced after its dry run (CUDA).

`helios.runtime.loading.dry_run_ahead.DryRunAhead.close` drops the stand-ins and empties their
storages, because something kept 1.4 GB of an 8B core's stand-in weights referenced through the
capture (bench/results/h100_session52_call3). This loads the Llama-3.1-8B-shaped random core (few
layers by default) with `close` wrapped: it holds weak references to the stand-ins, lets `close` run,
collects, and prints for each stand-in still alive the chain of objects that refer to it (types,
and the attribute or key names where they can be told). Run on a CUDA device from the repository root:
    PYTHONPATH=src:bench python3 bench/standin_referrers.py [--layers 2]
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import tempfile
import types
import weakref
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_serving import NAMESPACE, Workload, log, prepare  # noqa: E402
from random_llama import LLAMA_31_8B, with_layers  # noqa: E402

from helios.core.keys import SigningKey  # noqa: E402
from helios.core.reader import open_core  # noqa: E402
from helios.runtime.loading import dry_run_ahead  # noqa: E402
from helios.runtime.loading.model import LoadOptions  # noqa: E402
from helios.runtime.service import RuntimeOptions, build_runtime  # noqa: E402


def describe(holder, target) -> str:
    """`holder`'s type and how it holds `target` (a key, an attribute, an index) where that is found."""
    kind = type(holder).__qualname__
    if isinstance(holder, dict):
        for key, value in holder.items():
            if value is target:
                return f"dict[{key!r:.80}]"
        return f"dict (as a key, {len(holder)} entries)"
    if isinstance(holder, (list, tuple)):
        index = next((i for i, value in enumerate(holder) if value is target), None)
        return f"{kind}[{index}] of {len(holder)}"
    if isinstance(holder, types.FrameType):
        return f"frame {holder.f_code.co_filename.split('/')[-1]}:{holder.f_lineno} {holder.f_code.co_name}"
    if isinstance(holder, types.CellType):
        return "closure cell"
    if isinstance(holder, types.FunctionType):
        return f"function {holder.__qualname__}"
    return kind


def chains(target, depth: int, ignore: set[int], prefix: str = "") -> list[str]:
    """Lines naming each referrer of `target` and, to `depth`, theirs."""
    lines: list[str] = []
    holders = gc.get_referrers(target)
    ignore = ignore | {id(holders), id(lines)}  # this search's own lists refer to what they hold
    for index in range(len(holders)):
        holder = holders[index]
        if id(holder) in ignore or (isinstance(holder, types.FrameType) and holder.f_code in _OWN_CODE):
            continue
        lines.append(f"{prefix}<- {describe(holder, target)}")
        if depth > 1 and not isinstance(holder, (types.ModuleType, types.FrameType)):
            lines += chains(holder, depth - 1, ignore | {id(holder)}, prefix + "   ")
    return lines[:40]


_OWN_CODE: set = set()  # this script's frames (they hold what they look at)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--depth", type=int, default=5, help="referrer levels printed")
    args = parser.parse_args()
    _OWN_CODE.update({chains.__code__, main.__code__})
    device = torch.device("cuda")
    alive: list[weakref.ref] = []
    close = dry_run_ahead.DryRunAhead.close

    def watched_close(self) -> None:
        alive.extend(weakref.ref(t) for t in self._arguments if isinstance(t, torch.Tensor))
        close(self)

    dry_run_ahead.DryRunAhead.close = watched_close
    with tempfile.TemporaryDirectory() as scratch:
        key = SigningKey.generate()
        core = prepare(with_layers(LLAMA_31_8B, args.layers), [Workload(b, 128, 128) for b in (1, 64)],
                       Path(scratch), key, "bfloat16", 512, device)
        options = RuntimeOptions(load=LoadOptions(device="cuda", cuda_graphs=True), queue_capacity=72)
        runtime = build_runtime(open_core(core, accept=NAMESPACE, trusted_keys=[key.public]), options)
        log(f"loaded; the dry run ahead saw {len(alive)} stand-in tensors")
        gc.collect()
        survivors = [ref() for ref in alive]
        survivors = [t for t in survivors if t is not None]
        shapes = collections.Counter(tuple(t.shape) for t in survivors)
        log(f"{len(survivors)} still alive after the load and a collection: {dict(shapes.most_common(8))}")
        ignore = {id(survivors), id(sys._getframe())}
        for tensor in survivors[:6]:
            log(f"stand-in {tuple(tensor.shape)} {tensor.dtype} (storage {tensor.untyped_storage().nbytes()} bytes):")
            for line in chains(tensor, args.depth, ignore):
                log("  " + line)
        del survivors
        runtime.close()


if __name__ == "__main__":
    main()
