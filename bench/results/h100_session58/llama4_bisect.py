"""Session 58: Llama 4's float32 core gives other greedy tokens on CUDA than on the CPU from the first
token on (tests/gpu/test_families_cuda.py[llama4], call 2), where 52 other families agree. Runs the
family on CUDA with one suspect at a time replaced: eager instead of graphs, the rotary fusion off,
and each of Llama 4's ops (chunked attention, the expert and routing ops) run through its torch body
on CUDA instead of its Triton kernel. Prints, per case, the first differing token of each prompt.
Run from the repository root: PYTHONPATH=src:tests python bench/results/h100_session58/llama4_bisect.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from gpu import test_runtime_cuda as base
from ignition.hf_checkpoints import LLAMA4
from support.runtime_runs import first_difference, greedy_run, logits_error
from helios.abi import attention_chunked, moe
from helios.runtime.loading import rotary_calls

OVERRIDES = torch.library.Library("helios", "IMPL")


def cuda_body(name: str, body) -> None:
    OVERRIDES.impl(name, body, "CUDA")


def report(label: str, run, reference) -> None:
    firsts = [first_difference(t, e) for t, e in zip(run.tokens, reference.tokens)]
    error = logits_error(run, reference) if all(f is None for f in firsts) else float("nan")
    print(f"{label:40s} first differences {firsts} logits error {error:.2e}", flush=True)


def main() -> None:
    cores = base.Cores(Path(tempfile.mkdtemp(prefix="llama4-bisect-")))
    reference = cores.cpu_run(LLAMA4)
    core = lambda: cores.open(LLAMA4)  # noqa: E731
    cases = sys.argv[1:] or ["graphs", "eager", "no-fusion", "chunked-body", "experts-body", "route-body", "all-bodies"]
    for case in cases:
        if case == "graphs":
            report(case, greedy_run(core(), base.PROMPTS, base.NEW_TOKENS, base.cuda_options(True)), reference)
        elif case == "eager":
            report(case, greedy_run(core(), base.PROMPTS, base.NEW_TOKENS, base.cuda_options(False)), reference)
        elif case == "no-fusion":
            rotary_calls.FUSE_AT_CAPTURE = False
            report(case, greedy_run(core(), base.PROMPTS, base.NEW_TOKENS, base.cuda_options(True)), reference)
            rotary_calls.FUSE_AT_CAPTURE = True
        else:
            if case in ("chunked-body", "all-bodies"):
                cuda_body("paged_attention_chunked", attention_chunked.paged_attention_chunked.body)
            if case in ("experts-body", "all-bodies"):
                cuda_body("moe_experts", moe.moe_experts.body)
            if case in ("route-body", "all-bodies"):
                cuda_body("moe_route", moe.moe_route.body)
            report(case, greedy_run(core(), base.PROMPTS, base.NEW_TOKENS, base.cuda_options(False)), reference)


if __name__ == "__main__":
    main()
