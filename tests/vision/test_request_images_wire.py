"""A request's images as they travel to the engine process (pickled through its pipe): the vision
tensors padded to a patch capacity travel without their padding, and load equal. At Qwen2.5-VL's
default capacity (65,536 patches, the largest image its processor makes) an 8x8 image's padded
tensors pickled 310 MB, on the thread that submitted the request (the event loop's)."""

from __future__ import annotations

import base64
import io
import pickle

import numpy as np
import pytest

from helios.frontend.images.decode import ImageLimits
from helios.frontend.images.layout import ROTARY_OFFSETS, LayoutParams
from helios.frontend.images.pipeline import ImagePipeline
from helios.frontend.images.preparation import PreparationParams
from helios.runtime.execution.images import RequestImages

from .tiny_vl import MEAN, STD

PIL = pytest.importorskip("PIL.Image")
CAPACITY = 16_384  # patches: Qwen2.5-VL's max_pixels of 3,211,264 (its default is four times as many)


def _url(width: int, height: int) -> str:
    out = io.BytesIO()
    rgb = np.random.default_rng(width).integers(0, 255, size=(height, width, 3), dtype=np.uint8)
    PIL.fromarray(rgb).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def _request_images(urls: list[str]) -> RequestImages:
    """The images of a prompt holding one placeholder (id 7) per image, as `with_images` builds them."""
    params = PreparationParams(14, 2, MEAN, STD, 3136, CAPACITY * 14 * 14)
    pipeline = ImagePipeline(params, LayoutParams(7, 2, 112, 14), (64, CAPACITY), ImageLimits())
    prepared = pipeline.prepare(urls, (1, *[7] * len(urls), 2))
    bounds = np.cumsum((0, *prepared.feature_counts))
    tokens = prepared.prompt.feature_tokens
    return RequestImages(prepared.digests, prepared.patch_capacities, prepared.tensors,
                         tuple(tokens[bounds[i]:bounds[i + 1]] for i in range(len(urls))),
                         {ROTARY_OFFSETS: prepared.prompt.rotary_offsets})


def test_padded_vision_tensors_travel_without_their_padding_and_load_equal():
    images = _request_images([_url(8, 8), _url(300, 200), _url(30, 20)])
    assert images.patch_capacities == (64, CAPACITY, 64)
    padded = sum(array.nbytes for tensors in images.vision_inputs for array in tensors.values())
    data = pickle.dumps(images)
    assert padded > 75_000_000 and len(data) < 3_000_000, (padded, len(data))  # the 300x200 image at the large capacity
    loaded = pickle.loads(data)
    assert isinstance(loaded, RequestImages)
    assert (loaded.digests, loaded.patch_capacities) == (images.digests, images.patch_capacities)
    for ours, theirs in zip(loaded.vision_inputs, images.vision_inputs):
        assert ours.keys() == theirs.keys()
        for name, array in theirs.items():
            assert ours[name].dtype == array.dtype and ours[name].shape == array.shape, name
            np.testing.assert_array_equal(ours[name], array, err_msg=name)
    for ours, theirs in zip(loaded.feature_tokens, images.feature_tokens):
        np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(loaded.token_outputs[ROTARY_OFFSETS], images.token_outputs[ROTARY_OFFSETS])
    assert loaded.features_at == images.features_at and loaded.token_keys() == images.token_keys()


def test_arrays_of_any_shape_load_equal():
    """Zero rows inside an array are kept; an all-zero array, an empty one and a scalar load as sent."""
    arrays = {"inner": np.array([[0, 0], [1, 0], [0, 0], [0, 2], [0, 0], [0, 0]], dtype=np.int64),
              "zeros": np.zeros((5, 3), dtype=np.float32), "empty": np.zeros((0, 4), dtype=np.int32),
              "scalar": np.array(3, dtype=np.int16), "flat": np.array([4, 0, 5, 0, 0], dtype=np.int32),
              "wide": np.zeros((3, 0), dtype=np.float32)}
    images = RequestImages(("ab" * 32,), (4,), (arrays,), (np.array([1], dtype=np.int64),))
    (loaded,) = pickle.loads(pickle.dumps(images)).vision_inputs
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape, name
        np.testing.assert_array_equal(loaded[name], array, err_msg=name)
