"""Session 61: Llama 4's float32 core gave another first token on CUDA (110 for the CPU's 49) when it was the
first family of its process on an empty Triton cache, and the CPU's tokens in a later, warm run
(bench/results/h100_session61/README.md). One case per process, on the CUDA core only (the CPU path's
tokens are read from ROOT/reference.json, written by the `reference` case), so that each case is a process's
first load:

- `reference`: the CPU path's greedy run, saved as JSON;
- `graphs`: the default capture (the Triton precompile's workers and its dry run on stand-ins);
- `no-workers`: `compile_workers=0` (no worker, no dry run ahead: the warm-up runs compile);
- `eager`: no capture.

Prints each prompt's first differing token (64: none) and the logits error where all agree.
Run from the repository root, each case with its own TRITON_CACHE_DIR for an empty cache:
PYTHONPATH=src:tests python bench/results/h100_session61/llama4_cold.py CASE ROOT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpu import test_runtime_cuda as base
from ignition.hf_checkpoints import LLAMA4
from support.runtime_runs import first_difference, greedy_run
from helios.runtime.loading.model import LoadOptions


def main() -> None:
    case, root = sys.argv[1], Path(sys.argv[2])
    root.mkdir(parents=True, exist_ok=True)
    cores = base.Cores(root)  # the checkpoint is written once; each process prepares its core from it
    if case == "reference":
        run = greedy_run(cores.open(LLAMA4), base.PROMPTS, base.NEW_TOKENS)
        (root / "reference.json").write_text(json.dumps(run.tokens))
        print("reference written", flush=True)
        return
    expected = json.loads((root / "reference.json").read_text())
    load = {"graphs": LoadOptions(device="cuda", cuda_graphs=True),
            "no-workers": LoadOptions(device="cuda", cuda_graphs=True, compile_workers=0),
            "eager": LoadOptions(device="cuda", cuda_graphs=False)}[case]
    run = greedy_run(cores.open(LLAMA4), base.PROMPTS, base.NEW_TOKENS, load)
    firsts = [first_difference(t, e) for t, e in zip(run.tokens, expected)]
    print(f"{case:12s} first differences {[64 if f is None else f for f in firsts]} "
          f"first tokens {[t[0] for t in run.tokens]} (CPU {[e[0] for e in expected]})", flush=True)


if __name__ == "__main__":
    main()
