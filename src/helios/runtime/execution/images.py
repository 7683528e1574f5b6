"""Image inputs on the model worker: a request's laid-out images, their features, and the values
the image sources bind.

`RequestImages` is what the frontend's image layout produced for one request (plain arrays: the
runtime never imports the frontend): each image's content hash, its vision tensors at its patch
capacity, the prompt index of each of its features, and the per-token layout outputs (the packed
IMAGE_TENSOR sources, e.g. rotary offsets; a token past the prompt keeps the last row).

`ImageFeeder` runs before a PREFILL or MIXED step: for every feature token inside the step's
packed rows (row order, then prompt order: `step_features`) it takes the image's features from the
content-hash cache (`ImageFeatureCache`, a slab allocated at load) or encodes the image with the
VISION variant of its patch capacity into that cache, binding that graph's IMAGE_TENSOR
destinations from the image's vision tensors; then it copies the features of the step's feature
tokens into the feature buffer the prompt programs read, in that same order, which is the order
`step_features` numbers IMAGE_FEATURE_INDICES with. Nothing on this path allocates device memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from helios.contract import serving_pb2 as spb
from helios.errors import LoadError
from helios.runtime.loading.image_features import FEATURE_BUFFER_INPUT, ImageFeatureCache  # noqa: F401 (re-exported)
from helios.runtime.records.plan import PlanRow

S = spb


@dataclass(frozen=True, eq=False)
class RequestImages:
    digests: tuple[str, ...]
    patch_capacities: tuple[int, ...]
    vision_inputs: tuple[Mapping[str, np.ndarray], ...]  # per image: VISION IMAGE_TENSOR outputs
    feature_tokens: tuple[np.ndarray, ...]  # per image: prompt index of each feature, feature order
    token_outputs: Mapping[str, np.ndarray] = field(default_factory=dict)  # per prompt token [T, ...]

    def __reduce__(self):
        """Pickled (to the engine process, `helios.runtime.engine_link`) without the trailing all-zero
        rows of each vision tensor, restored as zeros on load (`_padded`): the arrays load equal. A
        vision tensor is padded to its patch capacity, the largest image's at a real checkpoint's default
        (65,536 patches of 1,176 floats for Qwen2.5-VL), so each image of any size, 8x8 pixels too,
        pickled 308 MB through the pipe, on the thread that submitted it, and held as much in the engine."""
        inputs = tuple({name: _trimmed(array) for name, array in tensors.items()} for tensors in self.vision_inputs)
        return _restored, (self.digests, self.patch_capacities, inputs, self.feature_tokens, dict(self.token_outputs))

    @cached_property
    def features_at(self) -> dict[int, tuple[int, int]]:
        """Prompt index -> (image number, feature row of that image)."""
        return {int(index): (number, row) for number, tokens in enumerate(self.feature_tokens)
                for row, index in enumerate(tokens)}

    def token_keys(self) -> tuple[tuple[int, int], ...]:
        """(prompt index, prefix-cache key) of every feature token: a negative key derived from the
        image's content hash, so equal token ids with different images never share cached pages."""
        keys = []
        for digest, tokens in zip(self.digests, self.feature_tokens):
            key = -(int(digest[:15], 16) + 1)
            keys += [(int(index), key) for index in tokens]
        return tuple(keys)

    def packed(self, name: str, start: int, count: int) -> np.ndarray:
        """Rows [start, start + count) of a per-token layout output (past the prompt: its last row)."""
        table = self.token_outputs[name]
        index = np.minimum(np.arange(start, start + count), len(table) - 1)
        return table[index]


def _trimmed(array: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """`array` without its trailing all-zero rows (found from the end, in doubling blocks, so the data
    rows are not scanned), and its shape."""
    if not array.ndim or not array.size:
        return array, array.shape
    rows = array.reshape(len(array), -1)
    end, block = len(rows), 64
    while end:
        start = max(0, end - block)
        nonzero = np.flatnonzero(rows[start:end].any(axis=1))
        if nonzero.size:
            end = start + int(nonzero[-1]) + 1
            break
        end, block = start, block * 2
    return (array if end == len(rows) else array[:end]), array.shape


def _padded(kept: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A trimmed array (`_trimmed`) at its shape again, zeros after its kept rows."""
    if kept.shape == tuple(shape):
        return kept
    array = np.zeros(shape, dtype=kept.dtype)
    array[:len(kept)] = kept
    return array


def _restored(digests, patch_capacities, inputs, feature_tokens, token_outputs) -> RequestImages:
    """A `RequestImages` pickled by its `__reduce__`."""
    vision_inputs = tuple({name: _padded(*trimmed) for name, trimmed in tensors.items()} for tensors in inputs)
    return RequestImages(digests, patch_capacities, vision_inputs, feature_tokens, token_outputs)


def step_features(rows: Sequence[PlanRow], images: Sequence[RequestImages | None]) -> list[tuple[int, int, int]]:
    """(packed token index, image number, feature row) of every feature token of the step, in row
    order, then prompt order; the i-th entry's features go to feature buffer row i."""
    out, offset = [], 0
    for row, request in zip(rows, images):
        if request is not None:
            at = request.features_at
            for position in range(row.start_pos, row.start_pos + len(row.token_ids)):
                found = at.get(position)
                if found is not None:
                    out.append((offset + position - row.start_pos, *found))
        offset += len(row.token_ids)
    return out


@dataclass
class FeederStats:
    encoded_images: int = 0


class ImageFeeder:
    """Encodes (or reuses) a step's image features and writes the feature buffer (module docstring).
    `vision(capacity)` returns the callable VISION program of that patch capacity, or None."""

    def __init__(self, prepared, buffers: Mapping[str, torch.Tensor], vision: Callable[[int], Callable | None],
                 cache: ImageFeatureCache):
        self._buffers = buffers
        self._vision = vision
        self.cache = cache
        self.stats = FeederStats()
        graphs = prepared.graphs_for(S.GRAPH_OPERATION_VISION)
        self._bindings = [(b.buffer, b.image_output) for g in graphs[:1] for b in g.bindings
                          if b.source == S.VALUE_SOURCE_IMAGE_TENSOR]
        self._features = buffers.get(FEATURE_BUFFER_INPUT)
        if graphs and self._features is None:
            raise LoadError(f"the core declares a VISION graph but no {FEATURE_BUFFER_INPUT!r} buffer")

    def feed(self, rows: Sequence[PlanRow], images: Sequence[RequestImages | None]) -> None:
        """Write the step's feature rows into the feature buffer; allocates no device memory (the
        features come from, or are encoded into, the cache's slab and are copied run by run)."""
        wanted = step_features(rows, images)
        if not wanted:
            return
        if len(wanted) > self._features.shape[0]:
            raise ValueError(f"{len(wanted)} image features in one step; the feature buffer holds "
                             f"{self._features.shape[0]}")
        groups: dict[tuple[int, int], tuple[RequestImages, int, list[int], list[int]]] = {}
        starts = np.cumsum([0] + [len(row.token_ids) for row in rows])
        for index, (packed, number, row) in enumerate(wanted):
            request = images[int(np.searchsorted(starts, packed, side="right")) - 1]
            _, _, targets, sources = groups.setdefault((id(request), number), (request, number, [], []))
            targets.append(index)
            sources.append(row)
        # One image at a time: its features are copied out before the next image may evict them.
        for request, number, targets, sources in groups.values():
            features = self._image_features(request, number)
            for target, source, count in contiguous_runs(targets, sources):
                self._features.narrow(0, target, count).copy_(features.narrow(0, source, count))

    def _image_features(self, request: RequestImages, number: int) -> torch.Tensor:
        digest = request.digests[number]
        features = self.cache.lookup(digest)
        if features is not None:
            return features
        program = self._vision(request.patch_capacities[number])
        if program is None:
            raise ValueError(f"no VISION program of patch capacity {request.patch_capacities[number]}")
        for buffer, output in self._bindings:
            target = self._buffers[buffer]
            value = torch.from_numpy(np.ascontiguousarray(request.vision_inputs[number][output]))
            target.narrow(0, 0, value.shape[0]).copy_(value)
        with torch.inference_mode():
            features = program()
        self.stats.encoded_images += 1
        return self.cache.store(digest, features[:len(request.feature_tokens[number])])


def contiguous_runs(targets: Sequence[int], sources: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first target, first source, count) of the runs where both index lists step by one."""
    runs: list[tuple[int, int, int]] = []
    for target, source in zip(targets, sources):
        if runs:
            first_target, first_source, count = runs[-1]
            if target == first_target + count and source == first_source + count:
                runs[-1] = (first_target, first_source, count + 1)
                continue
        runs.append((target, source, 1))
    return runs

