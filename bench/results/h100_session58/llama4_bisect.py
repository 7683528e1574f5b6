"""Session 58: Llama 4's float32 core gives other greedy tokens on CUDA than on the CPU from the first
token on (tests/gpu/test_families_cuda.py[llama4], call 2), where 52 other families agree. Runs the
family on CUDA with one suspect at a time changed: the rotary fusion off; with the fusion on,
programmatic dependent launch off, or the capture's step bookkeeping rewrite off; eager (no capture).
Prints, per case, the first differing token of each prompt (64: none).
Call 3 (session 58): eager and graphs without the fusion agree with the CPU; graphs with it do not.
The fused programs' arithmetic on recorded inputs, on the CPU (the fused kernel interpreted, the
capture's rewrites applied), equals the unfused programs' bit for bit: a compiled-only difference.
Run from the repository root: PYTHONPATH=src:tests python bench/results/h100_session58/llama4_bisect.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from gpu import test_runtime_cuda as base
from ignition.hf_checkpoints import LLAMA4
from support.runtime_runs import first_difference, greedy_run, logits_error
from helios.abi import dependent_launch
from helios.runtime.loading import rotary_calls, step_calls


def report(label: str, run, reference) -> None:
    firsts = [first_difference(t, e) for t, e in zip(run.tokens, reference.tokens)]
    error = logits_error(run, reference) if all(f is None for f in firsts) else float("nan")
    print(f"{label:40s} first differences {firsts} logits error {error:.2e}", flush=True)


def main() -> None:
    cores = base.Cores(Path(tempfile.mkdtemp(prefix="llama4-bisect-")))
    reference = cores.cpu_run(LLAMA4)
    core = lambda: cores.open(LLAMA4)  # noqa: E731
    cases = sys.argv[1:] or ["graphs", "no-fusion", "no-pdl", "no-step-calls", "eager"]
    rotary_calls.FUSE_WITH_CHUNKED = True  # the runtime leaves Llama 4's programs unfused since call 3
    for case in cases:
        rotary_calls.FUSE_AT_CAPTURE = case != "no-fusion"
        dependent_launch.ENABLED = case != "no-pdl"
        step_calls.STEP_CALLS = case != "no-step-calls"
        report(case, greedy_run(core(), base.PROMPTS, base.NEW_TOKENS, base.cuda_options(case != "eager")), reference)


if __name__ == "__main__":
    main()
