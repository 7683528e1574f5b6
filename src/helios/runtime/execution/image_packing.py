"""Packing of the image value sources (`Packer` delegates here).

PREFILL and MIXED graphs bind IMAGE_TENSOR per packed token (a per-token output of the image
layout, e.g. rotary offsets: each row's tokens take the request's rows from its start position, a
request without images takes padding) and IMAGE_FEATURE_INDICES (the feature buffer row of each
feature token, numbered as `images.step_features` orders them, which is the order the executor's
`ImageFeeder` writes the buffer in; other tokens take padding), IMAGE_CONTEXT_INDICES (per
packed token: a feature token's feature row within its own image, other tokens padding) and
IMAGE_FEATURE_SLOT (per row: the feature buffer row of the row's first feature token this step,
padding for a row without one). A VISION graph's IMAGE_TENSOR bindings (SCALAR: whole vision
tensors of one image) are written by the `ImageFeeder` when it encodes an image, not by step
packing. Which indexing each source takes is `helios.contract.servable.SOURCES`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from helios.contract import serving_pb2 as spb
from helios.runtime.execution.images import step_features
from helios.runtime.records.plan import PlanRow

S = spb
IMAGE_SOURCES = frozenset({S.VALUE_SOURCE_IMAGE_TENSOR, S.VALUE_SOURCE_IMAGE_FEATURE_INDICES,
                           S.VALUE_SOURCE_IMAGE_CONTEXT_INDICES, S.VALUE_SOURCE_IMAGE_FEATURE_SLOT})


def fill_image(binding, target: torch.Tensor, rows: Sequence[PlanRow], images: Sequence) -> None:
    """Fills one image binding for `rows`; `images[i]`: row i's `RequestImages` or None."""
    if binding.source in (S.VALUE_SOURCE_IMAGE_FEATURE_INDICES, S.VALUE_SOURCE_IMAGE_CONTEXT_INDICES):
        target.fill_(binding.padding)
        by_context = binding.source == S.VALUE_SOURCE_IMAGE_CONTEXT_INDICES
        for index, (packed, _, feature_row) in enumerate(step_features(rows, images)):
            target[packed] = (feature_row if by_context else index) + binding.offset
        return
    if binding.source == S.VALUE_SOURCE_IMAGE_FEATURE_SLOT:
        _fill_feature_slots(binding, target, rows, images)
        return
    parts, count = [], 0
    for row, request in zip(rows, images):
        n = len(row.token_ids)
        if request is not None and binding.image_output in request.token_outputs:
            parts.append(request.packed(binding.image_output, row.start_pos, n))
        else:
            parts.append(np.full((n, *target.shape[1:]), binding.padding, dtype=np.int64))
        count += n
    if count > target.shape[0]:
        raise ValueError(f"{binding.destination}: {count} tokens exceed the buffer's {target.shape[0]} rows")
    if parts:
        target[:count] = torch.from_numpy(np.concatenate(parts)).to(target.dtype)
    target[count:] = binding.padding


def _fill_feature_slots(binding, target: torch.Tensor, rows: Sequence[PlanRow], images: Sequence) -> None:
    """Each row's first feature buffer row of this step (features numbered as `step_features`)."""
    target.fill_(binding.padding)
    ends, offset = [], 0
    for row in rows:
        offset += len(row.token_ids)
        ends.append(offset)
    first: dict[int, int] = {}
    for index, (packed, _, _) in enumerate(step_features(rows, images)):
        row_index = next(i for i, end in enumerate(ends) if packed < end)
        first.setdefault(row_index, index)
    for row_index, index in first.items():
        target[row_index] = index + binding.offset
