"""Grammar-mask rows: every row's mask clears the vocabulary's excluded ids (declared non-sampled
ids inside the sampled range, e.g. an image sentinel), so the sampler never returns them."""

from __future__ import annotations

from typing import Sequence

import torch

from helios.contract import serving_pb2 as spb
from helios.runtime.records.plan import PlanRow


def allowed_row(vocabulary: spb.VocabularyContract) -> torch.Tensor | None:
    """The mask row of an unconstrained request: every id but the vocabulary's excluded ids (ids
    inside the sampled range that sampling never returns, e.g. image sentinels); None: all ids."""
    if not vocabulary.excluded_ids:
        return None
    bits = torch.full((vocabulary.mask_words,), -1, dtype=torch.int64) & 0xFFFFFFFF
    for token in vocabulary.excluded_ids:
        bits[token // 32] &= ~(1 << (token % 32)) & 0xFFFFFFFF
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)


def write_masks(target: torch.Tensor, rows: Sequence[PlanRow], masks, pad: bool,
                 allowed: torch.Tensor | None = None) -> None:
    """Constrained rows get their grammar mask; every other row (and, with `pad`, the padding
    rows) every token allowed: -1, or `allowed` (excluded ids cleared). A grammar mask is
    intersected with `allowed` too."""
    filled = target[: target.shape[0] if pad else len(rows)]
    if allowed is None:
        filled.fill_(-1)
    else:
        filled.copy_(allowed.expand_as(filled))
    for index, row in enumerate(rows):
        mask = masks.get(row.request_id) if row.constrained else None
        if mask is not None:
            target[index] = mask if allowed is None else mask & allowed
