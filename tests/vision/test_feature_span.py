"""Image layout FEATURE_SPAN (the example contract's layout): each image's placeholder becomes one
contiguous span of feature placeholders, positions stay plain, and the vision tensors are the image's
still patches (no temporal dimension) padded to the patch capacity with its grid; the pipeline reads it
from the contract, and refuses layout outputs the layout does not produce. A grammar's tokenizer
leaves out input-only ids past the sampled vocabulary."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest

from helios.contract import PreparedContract
from helios.errors import LoadError
from helios.frontend.images.decode import ImageLimits
from helios.frontend.images.errors import ImageRejected
from helios.frontend.images.feature_span import span_prompt, span_tensors
from helios.frontend.images.layout import LayoutParams
from helios.frontend.images.pipeline import ImagePipeline
from helios.frontend.images.preparation import PreparedImage
from helios.frontend.structured.grammar import sampled_tokenizer_json

PIL = pytest.importorskip("PIL.Image")
TINY = Path(__file__).resolve().parents[2] / "examples" / "contract-tiny.json"
FEATURE = 384


def _image(grid_h: int, grid_w: int, width: int = 12) -> PreparedImage:
    patches = np.arange(grid_h * grid_w * width, dtype=np.float32).reshape(grid_h * grid_w, width)
    return PreparedImage(patches, grid_h, grid_w, "d" * 64)


def test_a_placeholder_becomes_a_span_of_features_at_plain_positions():
    params = LayoutParams(FEATURE, 2, 0, 2)
    prompt = span_prompt([1, 267, FEATURE, 268, 5, FEATURE, 6], [_image(4, 4), _image(2, 4)], params)
    assert prompt.token_ids == (1, 267, *[FEATURE] * 4, 268, 5, *[FEATURE] * 2, 6)
    assert prompt.feature_tokens.tolist() == [2, 3, 4, 5, 8, 9]
    assert prompt.positions.tolist() == [[i, i, i] for i in range(len(prompt.token_ids))]
    assert prompt.position_delta == 0 and not prompt.rotary_offsets.any()
    with pytest.raises(ImageRejected, match="2 image placeholders for 1 images"):
        span_prompt([FEATURE, FEATURE], [_image(2, 2)], params)


def test_vision_tensors_are_the_patches_padded_with_the_grid():
    image = _image(2, 4)
    tensors = span_tensors(image, 16)
    assert tensors["pixel_patches"].shape == (16, 12)
    assert np.array_equal(tensors["pixel_patches"][:8], image.patches) and not tensors["pixel_patches"][8:].any()
    assert tensors["grid_thw"].tolist() == [[1, 2, 4]] and tensors["grid_thw"].dtype == np.int16
    with pytest.raises(ImageRejected, match="needs 8 vision patches; at most 4"):
        span_tensors(image, 4)


def _png(size: int) -> str:
    out = io.BytesIO()
    PIL.new("RGB", (size, size), (200, 10, 30)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_the_pipeline_prepares_still_patches_for_the_example_contract():
    model = PreparedContract.from_json(TINY.read_text()).contract.model
    pipeline = ImagePipeline.from_contract(model, ImageLimits(max_images=2))
    assert pipeline.preparation.patch_width == 12  # 3 channels x 2 x 2, no temporal frames
    prepared = pipeline.prepare([_png(8), _png(16)], [267, FEATURE, 268, 267, FEATURE, 268])
    assert prepared.prompt.token_ids.count(FEATURE) == 4 + 16
    assert prepared.patch_capacities == (16, 64) and prepared.feature_counts == (4, 16)
    assert prepared.tensors[0]["pixel_patches"].shape == (16, 12)


def test_outputs_the_layout_does_not_produce_fail_at_load():
    model = PreparedContract.from_json(TINY.read_text()).contract.model
    model.frontend.image_layout_data.outputs.append("rotary_positions")
    with pytest.raises(LoadError, match=r"\['rotary_positions'\].*FEATURE_SPAN"):
        ImagePipeline.from_contract(model, ImageLimits())


def test_grammar_tokenizers_leave_out_input_only_ids():
    data = {"added_tokens": [{"id": 3, "content": "<a>"}, {"id": 9, "content": "<img>"}],
            "model": {"vocab": {"a": 0, "b": 1, "c": 8}}}
    kept = json.loads(sampled_tokenizer_json(json.dumps(data), 8))
    assert kept["added_tokens"] == [{"id": 3, "content": "<a>"}] and kept["model"]["vocab"] == {"a": 0, "b": 1}
    text = json.dumps({"added_tokens": [{"id": 3}], "model": {"vocab": {"a": 0}}})
    assert sampled_tokenizer_json(text, 8) is text
