"""What one launched plan yields: `Launched`, the handle `launch` returns and `finish` completes,
`StepOutput`, the validated per-row results of a finished plan
(`helios.runtime.execution.executor`, `helios.runtime.execution.protocol`), and
`with_token_logprobs`, which attaches a token-logprobs program's values to those results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from helios.runtime.loading.model import LoadedProgram
from helios.runtime.records.events import TokenLogprobs
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


def with_token_logprobs(results: tuple[RowResult, ...], counts: Sequence[int | None],
                        scores: tuple[torch.Tensor, ...]) -> tuple[RowResult, ...]:
    """`results` with one `TokenLogprobs` per emitted token of every row whose `counts` entry (its
    request's number of alternatives) is not None. `scores` are the host copies of the program's
    `TOKEN_LOGPROB_OUTPUTS`: one entry a row ([R], [R, K], [R, K]: the row's one token), or a
    SPECULATIVE variant's one entry a verify position ([R, W], [R, W, K], [R, W, K]: position j
    scores the lane's emitted token j). A row that emits nothing, or more tokens than it has
    entries, keeps None."""
    chosen, top_ids, top_values = (tensor.tolist() for tensor in scores)
    per_position = scores[0].dim() == 2
    out = []
    for index, (result, count) in enumerate(zip(results, counts)):
        num_tokens = len(result.token_ids)
        row = ((chosen[index], top_ids[index], top_values[index]) if per_position
               else ([chosen[index]], [top_ids[index]], [top_values[index]]))
        if count is None or not 0 < num_tokens <= len(row[0]):
            out.append(result)
            continue
        logprobs = tuple(TokenLogprobs(row[0][j], tuple(zip(row[1][j][:count], row[2][j][:count])))
                         for j in range(num_tokens))
        out.append(result._replace(logprobs=logprobs))
    return tuple(out)
