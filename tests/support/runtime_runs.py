"""Greedy generation through the real runtime, with the logits of every sampled token recorded.

`greedy_run(core, prompts, max_tokens, load)` builds the runtime (`build_runtime`) with `load`
options (device, CUDA graphs), wraps its executor so that after each plan the logits row of every
row that sampled is copied to the host (in one execution frame: a captured program's logits are
overwritten by the next replay, so a second frame would replace them before they are read), generates with `helios.runtime.offline.generate` and closes
the runtime. Used by the CUDA runtime tests and, on the CPU, by tests/runtime/test_engine_soak.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helios.runtime.records.events import FinishReason
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime

LOGITS_OUTPUT = "logits"  # the programs' logits output, one row per submitted row
OFFLINE_ID = "offline-{}"  # `offline.generate` names the request of prompt i so


@dataclass(frozen=True)
class GreedyRun:
    tokens: list[list[int]]  # per prompt
    logits: list[list[torch.Tensor]]  # per prompt, per output token: float32 [V] on the host
    captured: bool  # every program of the loaded model was a captured CUDA graph


def record_logits(executor) -> dict[str, dict[int, torch.Tensor]]:
    """Wraps `executor.run`; returns request id -> output index -> logits (host float32 copies)."""
    recorded: dict[str, dict[int, torch.Tensor]] = {}
    run = executor.run

    def recording(plan, masks=None):
        output = run(plan, masks)
        logits = output.outputs.get(LOGITS_OUTPUT)
        for index, (row, result) in enumerate(zip(plan.rows, output.results)):
            if result.token_ids:
                recorded.setdefault(row.request_id, {})[row.sample_index] = logits[index].float().cpu()
        return output

    executor.run = recording
    return recorded


def greedy_run(core, prompts, max_tokens: int, load: LoadOptions = LoadOptions()) -> GreedyRun:
    """Greedy tokens and logits of `prompts` (no EOS stop) on a fresh runtime for `core`."""
    runtime = build_runtime(core, RuntimeOptions(load=load))
    try:
        captured = all(type(p.module).__name__ == "CapturedProgram" for p in runtime.model.programs)
        runtime.engine.frames = 1
        recorded = record_logits(runtime.engine.executor)
        results = generate(runtime.engine, prompts, max_tokens)
    finally:
        runtime.close()
    ids = [OFFLINE_ID.format(index) for index in range(len(prompts))]
    assert set(recorded) == set(ids), f"recorded requests {sorted(recorded)}"
    assert all(r.finish_reason == FinishReason.LENGTH for r in results), [r.finish_reason for r in results]
    logits = [[recorded[i][k] for k in range(max_tokens)] for i in ids]
    return GreedyRun([list(r.token_ids) for r in results], logits, captured)


def first_difference(a: list[int], b: list[int]) -> int:
    """Index of the first differing token (the shorter length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def logits_error(run: GreedyRun, reference: GreedyRun) -> float:
    """Largest relative error ||l - l_ref|| / ||l_ref|| over the output positions whose inputs are
    identical in both runs (up to and including each prompt's first differing token)."""
    worst = 0.0
    for tokens, logits, ref_tokens, ref_logits in zip(run.tokens, run.logits, reference.tokens, reference.logits):
        same = min(first_difference(tokens, ref_tokens) + 1, len(tokens))
        for got, want in zip(logits[:same], ref_logits[:same]):
            worst = max(worst, float((got - want).norm() / want.norm()))
    return worst
