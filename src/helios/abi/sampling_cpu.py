"""The CPU's greedy fast path of ``helios::sample`` (see `helios.abi.sampling` for the semantics).

When no row of a call draws (temperature > 0), none is penalised (repetition 1, presence 0,
frequency 0) and none is grammar-masked, the reference pipeline reduces to: NaN -> -inf,
+inf -> float32 max, the argmax with the lowest id on ties, and NO_TOKEN for a row with nothing
above -inf. Widening float32 to float64 is exact and keeps the order, neutral penalties leave
every value as it is (x / 1, x * 1 and x - 0 * c - 0 are x), so the float32 argmax selects the
reference's token bit for bit, without the [R, V] float64 copies, penalty passes and row
selection. Any other call returns None and takes the reference pipeline.
"""

from __future__ import annotations

import torch

_NEUTRAL_PENALTIES = torch.tensor([1.0, 0.0, 0.0])  # repetition, presence, frequency: off
_F32_MAX = torch.finfo(torch.float32).max
_NEG_INF = float("-inf")
NO_TOKEN = -1  # as `helios.abi.sampling.NO_TOKEN`


def greedy_fast_path_applies(temperature: torch.Tensor, penalties: torch.Tensor, mask_rows: torch.Tensor) -> bool:
    """Whether every row is greedy, unpenalised and unmasked (reads the values on the host)."""
    special = (temperature > 0).any() | mask_rows.any() | (penalties != _NEUTRAL_PENALTIES).any()
    return not bool(special)


def greedy_tokens_cpu(logits: torch.Tensor, temperature: torch.Tensor, penalties: torch.Tensor,
                      mask_rows: torch.Tensor) -> torch.Tensor | None:
    """int64 [R] greedy tokens of validated float32 logits [R, V] when the fast path applies
    (see the module docstring), else None."""
    if logits.device.type != "cpu" or not greedy_fast_path_applies(temperature, penalties, mask_rows):
        return None
    values = torch.nan_to_num(logits, nan=_NEG_INF, posinf=_F32_MAX, neginf=_NEG_INF)
    best, tokens = values.max(dim=-1)  # the first maximal index: the lowest id on ties
    return torch.where(best > _NEG_INF, tokens, NO_TOKEN)
