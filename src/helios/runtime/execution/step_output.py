"""What one launched plan yields: `Launched`, the handle `launch` returns and `finish` completes, and
`StepOutput`, the validated per-row results of a finished plan
(`helios.runtime.execution.executor`, `helios.runtime.execution.protocol`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from helios.runtime.loading.model import LoadedProgram
from helios.runtime.records.plan import RowResult, StepPlan


@dataclass(frozen=True)
class StepOutput:
    """Validated per-row results, plus the program's named outputs (read-only) and the launches of
    state programs the plan's copies made (operation name -> count)."""

    results: tuple[RowResult, ...]
    outputs: Mapping[str, torch.Tensor]
    state_launches: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Launched:
    """A plan whose program was submitted (`Executor.launch`); `Executor.finish` completes it."""

    plan: StepPlan
    program: LoadedProgram | None  # None: a plan of copies only
    outputs: Mapping[str, torch.Tensor]
    done: torch.cuda.Event | None  # recorded after the record's copy (CUDA only)
    scores: tuple[torch.Tensor, ...] | None = None  # host copies of a token-logprobs program's outputs
    state_launches: Mapping[str, int] = field(default_factory=dict)  # SNAPSHOT / RESTORATION programs the copies ran
