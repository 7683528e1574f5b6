"""Packing of the image value sources (`Packer` delegates here).

PREFILL and MIXED graphs bind IMAGE_TENSOR per packed token (a per-token output of the image
layout, e.g. rotary offsets: each row's tokens take the request's rows from its start position, a
request without images takes padding) and IMAGE_FEATURE_INDICES (the feature buffer row of each
feature token, numbered as `images.step_features` orders them, which is the order the executor's
`ImageFeeder` writes the buffer in; other tokens take padding). A VISION graph's IMAGE_TENSOR
bindings (SCALAR: whole vision tensors of one image) are written by the `ImageFeeder` when it
encodes an image, not by step packing. IMAGE_CONTEXT_INDICES and IMAGE_FEATURE_SLOT are not
supplied by this runtime (a core binding them fails at load).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from helios.contract import serving_pb2 as spb
from helios.runtime.execution.images import step_features
from helios.runtime.records.plan import PlanRow

S = spb
IMAGE_SOURCES = frozenset({S.VALUE_SOURCE_IMAGE_TENSOR, S.VALUE_SOURCE_IMAGE_FEATURE_INDICES})


def supports(view, operation: int) -> bool:
    """Whether this runtime supplies an image binding of a graph of `operation`."""
    if view.source == S.VALUE_SOURCE_IMAGE_FEATURE_INDICES:
        return view.indexing == S.INDEXING_PACKED_TOKEN
    if view.source == S.VALUE_SOURCE_IMAGE_TENSOR:
        if operation == S.GRAPH_OPERATION_VISION:
            return view.indexing == S.INDEXING_SCALAR
        return view.indexing == S.INDEXING_PACKED_TOKEN
    return False


def fill_image(binding, target: torch.Tensor, rows: Sequence[PlanRow], images: Sequence) -> None:
    """Fills one image binding for `rows`; `images[i]`: row i's `RequestImages` or None."""
    if binding.source == S.VALUE_SOURCE_IMAGE_FEATURE_INDICES:
        target.fill_(binding.padding)
        for index, (packed, _, _) in enumerate(step_features(rows, images)):
            target[packed] = index + binding.offset
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
