"""Session 62: Llama 4's float32 core on CUDA after the dry-run fix (9446f29f: a skipped launch of the Triton
precompile's dry run zeroed the step-calls constants it was given, Llama 4's ``ones`` MoE combine weights
among them, on a process's first load over an empty Triton cache; bench/results/h100_session61 saw another
first token then). One case per process, on the CUDA core only (the CPU path's tokens are read from
ROOT/reference.json, written by the `reference` case), so that each case is a process's first load:

- `reference`: the CPU path's greedy run, saved as JSON;
- `graphs`: the default capture (the Triton precompile's workers and its dry run on stand-ins; Llama 4's
  rotary/attention pairs fused, `rotary_calls.FUSE_WITH_CHUNKED`, on again since the fix);
- `no-workers`: `compile_workers=0` (no worker, no dry run ahead: the warm-up runs compile);
- `unfused`: the default capture with those pairs unfused (as sessions 58-61 captured them);
- `eager`: no capture.

Prints each prompt's first differing token (64: none) and the logits error where all agree.
Run from the repository root, each case with its own TRITON_CACHE_DIR for an empty cache:
PYTHONPATH=src:tests python bench/results/session62/llama4_cold.py CASE ROOT
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
    if case == "unfused":
        from helios.runtime.loading import rotary_calls
        rotary_calls.FUSE_WITH_CHUNKED = False
    load = {"graphs": LoadOptions(device="cuda", cuda_graphs=True), "unfused": LoadOptions(device="cuda", cuda_graphs=True),
            "no-workers": LoadOptions(device="cuda", cuda_graphs=True, compile_workers=0),
            "eager": LoadOptions(device="cuda", cuda_graphs=False)}[case]
    run = greedy_run(cores.open(LLAMA4), base.PROMPTS, base.NEW_TOKENS, load)
    firsts = [first_difference(t, e) for t, e in zip(run.tokens, expected)]
    print(f"{case:12s} first differences {[64 if f is None else f for f in firsts]} "
          f"first tokens {[t[0] for t in run.tokens]} (CPU {[e[0] for e in expected]})", flush=True)


if __name__ == "__main__":
    main()
