"""The image feature cache is one slab allocated up front; storing and feeding features only copies
into existing storage (checked op by op: the request path runs no op that allocates), evicting the
least recently used image's slot when full."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helios.contract import serving_pb2 as spb
from helios.runtime.loading.image_features import ImageFeatureCache
from helios.runtime.execution.images import FEATURE_BUFFER_INPUT, ImageFeeder, RequestImages, contiguous_runs
from helios.runtime.records.plan import PlanRow

WIDTH, ROWS_PER_IMAGE, PATCHES = 6, 4, 8
# Views and in-place copies; lift_fresh wraps the host patches `torch.from_numpy` shares (no storage).
VIEW_OPS = frozenset({"slice", "narrow", "copy_", "alias", "view", "select", "detach", "as_strided", "lift_fresh"})


class OpLog(TorchDispatchMode):
    """Records every aten op run under it."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_slots_alias_the_slab_and_evict_least_recent():
    cache = ImageFeatureCache(2, ROWS_PER_IMAGE, WIDTH)
    slab = cache.slab.data_ptr()
    a = cache.store("a", torch.full((3, WIDTH), 1.0))
    cache.store("b", torch.full((2, WIDTH), 2.0))
    assert a.data_ptr() == slab and cache.lookup("a").shape == (3, WIDTH)  # "a" is now most recent
    cache.store("c", torch.full((4, WIDTH), 3.0))  # evicts "b", reuses its slot
    assert cache.lookup("b") is None and "c" in cache and cache.stats.evictions == 1
    assert torch.equal(cache.lookup("a"), torch.full((3, WIDTH), 1.0))
    assert cache.lookup("c").data_ptr() == slab + ROWS_PER_IMAGE * WIDTH * 4
    assert cache.slab.data_ptr() == slab and cache.slab.shape == (2 * ROWS_PER_IMAGE, WIDTH)
    assert (cache.stats.hits, cache.stats.misses) == (3, 1)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="at least one image slot"):
        ImageFeatureCache(0, ROWS_PER_IMAGE, WIDTH)
    with pytest.raises(ValueError, match="an image slot holds 4"):
        ImageFeatureCache(1, ROWS_PER_IMAGE, WIDTH).store("a", torch.zeros(5, WIDTH))


def test_contiguous_runs():
    assert contiguous_runs([0, 1, 2, 5, 6], [3, 4, 5, 0, 2]) == [(0, 3, 3), (5, 0, 1), (6, 2, 1)]
    assert contiguous_runs([], []) == []


@dataclass
class _Binding:
    buffer: str
    image_output: str
    source: int = spb.VALUE_SOURCE_IMAGE_TENSOR


@dataclass
class _Graph:
    bindings: list


class _Prepared:
    def graphs_for(self, operation):
        return [_Graph([_Binding("pixels_in", "pixels")])] if operation == spb.GRAPH_OPERATION_VISION else []


def _feeder(num_images: int):
    """A feeder whose vision program, like a replayed CUDA graph, writes a static output (here: the
    bound patches' first rows, as features) and returns it."""
    buffers = {FEATURE_BUFFER_INPUT: torch.zeros(16, WIDTH), "pixels_in": torch.zeros(PATCHES, WIDTH)}
    static = torch.zeros(ROWS_PER_IMAGE, WIDTH)

    def program():
        return static.copy_(buffers["pixels_in"].narrow(0, 0, ROWS_PER_IMAGE))

    feeder = ImageFeeder(_Prepared(), buffers, lambda capacity: program if capacity == PATCHES else None,
                         ImageFeatureCache(num_images, ROWS_PER_IMAGE, WIDTH))
    return feeder, buffers[FEATURE_BUFFER_INPUT]


def _pixels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((PATCHES, WIDTH)).astype(np.float32)


def _request(seeds, positions) -> RequestImages:
    return RequestImages(tuple(f"digest-{s}" for s in seeds), (PATCHES,) * len(seeds),
                         tuple({"pixels": _pixels(s)} for s in seeds),
                         tuple(np.array(p) for p in positions))


def _row(request_id: str, slot: int, length: int) -> PlanRow:
    return PlanRow(request_id, slot, 1, tuple(range(length)), False, 0, length, 0, (), True, 0, 1, True, False)


@pytest.mark.parametrize("num_images", [1, 4])
def test_feeding_a_step_only_copies_and_reuses_cached_images(num_images):
    feeder, features = _feeder(num_images)
    first = _request((1, 2), ([1, 2, 3], [6, 7]))  # image 1: 3 features, image 2: 2 features
    second = _request((2,), ([0, 1],))
    rows = [_row("a", 0, 9), _row("b", 1, 3)]
    with OpLog() as log:
        feeder.feed(rows, [first, second])
    assert set(log.ops) <= VIEW_OPS, sorted(set(log.ops) - VIEW_OPS)
    expected = np.concatenate([_pixels(1)[:3], _pixels(2)[:2], _pixels(2)[:2]])
    assert torch.equal(features[:7], torch.from_numpy(expected))
    encoded = feeder.stats.encoded_images
    with OpLog() as log:
        feeder.feed([_row("c", 2, 3)], [second])  # image 2 again
    assert set(log.ops) <= VIEW_OPS
    assert torch.equal(features[:2], torch.from_numpy(_pixels(2)[:2]))
    stats = feeder.cache.stats
    if num_images == 4:  # every image stays cached: two encodings, then hits
        assert (encoded, feeder.stats.encoded_images, stats.hits, stats.evictions) == (2, 2, 2, 0)
    else:  # one slot: each image is copied out before the next evicts it
        assert (encoded, stats.hits, stats.evictions) == (2, 2, 1)


def test_the_default_image_count_keeps_the_slab_within_a_gibibyte():
    from helios.runtime.loading.image_features import default_num_images

    assert default_num_images(64, 64, 4) == 16  # tiny images: the default count
    assert default_num_images(16384, 3584, 2) == 9  # Qwen2.5-VL-7B's largest image: 112 MiB a slot
    assert default_num_images(16384, 4 * 4096, 2) == 2 and default_num_images(1 << 20, 8192, 4) == 1
