"""The image value sources on the model worker: which packed tokens take which feature rows, the
per-token layout outputs (past the prompt: the last row), the prefix-cache keys of feature tokens,
and the 400s of image parts on a model that cannot take them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helios.contract import serving_pb2 as spb
from helios.frontend.images.errors import ImageRejected
from helios.frontend.preparation.prompt import Prompt
from helios.frontend.preparation.prompt_images import UnavailableImages, with_images
from helios.runtime.execution.image_packing import fill_image
from helios.runtime.execution.images import RequestImages, step_features
from helios.runtime.execution.bindings import Binding
from helios.runtime.records.plan import PlanRow

S = spb


def _images(digest: str, tokens: list[int], length: int) -> RequestImages:
    offsets = np.zeros((length, 3), dtype=np.int64)
    offsets[tokens[0]:] = [[0, 1, 2]] * (length - tokens[0])
    return RequestImages((digest,), (16,), ({},), (np.array(tokens),), {"rotary_offsets": offsets})


def _row(request_id: str, start: int, count: int) -> PlanRow:
    return PlanRow(request_id, 0, 0, tuple(range(count)), False, start, count, 0, (), True, 0, 1, False, False)


def test_feature_rows_follow_rows_then_prompt_order():
    a, b = _images("a" * 64, [2, 3, 4], 8), _images("b" * 64, [5, 6], 9)
    rows = [_row("a", 3, 4), _row("text", 0, 2), _row("b", 4, 5)]
    assert step_features(rows, [a, None, b]) == [(0, 0, 1), (1, 0, 2), (7, 0, 0), (8, 0, 1)]


def test_packed_sources_fill_feature_indices_and_rotary_offsets():
    a = _images("a" * 64, [2, 3], 5)
    requests = [a, None]
    rows = [_row("a", 1, 6), _row("t", 0, 2)]  # row a runs past its 5-token prompt (a recomputation)
    indices = torch.zeros(10, dtype=torch.int64)
    fill_image(Binding("idx", "idx", S.VALUE_SOURCE_IMAGE_FEATURE_INDICES, S.INDEXING_PACKED_TOKEN, 0, -1, 0),
               indices, rows, requests)
    assert indices.tolist() == [-1, 0, 1, -1, -1, -1, -1, -1, -1, -1]
    offsets = torch.full((10, 3), 7, dtype=torch.int64)
    fill_image(Binding("rot", "rot", S.VALUE_SOURCE_IMAGE_TENSOR, S.INDEXING_PACKED_TOKEN, 0, 0, 0, "rotary_offsets"),
               offsets, rows, requests)
    assert offsets[:6].tolist() == [[0, 0, 0]] + [[0, 1, 2]] * 5  # past the prompt: the last row
    assert offsets[6:].tolist() == [[0, 0, 0]] * 4  # the text request and the padding


def test_prefix_keys_depend_on_the_image_not_the_token():
    a, b = _images("a" * 64, [2, 3], 5), _images("b" * 64, [2, 3], 5)
    assert [i for i, _ in a.token_keys()] == [2, 3]
    assert a.token_keys() != b.token_keys() and all(key < 0 for _, key in a.token_keys())


def test_image_parts_on_a_model_that_cannot_take_them_are_400s():
    prompt = Prompt("x", (1, 2), None, "", 0, ("data:image/png;base64,AA==",))
    with pytest.raises(ImageRejected, match="takes no images"):
        with_images(prompt, None)
    with pytest.raises(ImageRejected, match="FEATURE_SPAN"):
        with_images(prompt, UnavailableImages("image layout IMAGE_LAYOUT_FEATURE_SPAN is not implemented"))
    assert with_images(Prompt("x", (1,), None, "", 0), None) == (Prompt("x", (1,), None, "", 0), None)


@pytest.mark.parametrize("part, problem", [
    ({"type": "image_url", "image_url": {}}, "non-empty url"),
    ({"type": "image_url", "image_url": {"url": "data:x", "detail": "huge"}}, "detail must be one of"),
    ({"type": "image_url", "image_url": {"url": "data:x"}, "extra": 1}, "does not take"),
    ({"type": "audio"}, "must be a text part"),
])
def test_malformed_image_parts_are_request_errors(part, problem):
    from helios.errors import RequestError
    from helios.frontend.preparation.messages import parse_messages

    with pytest.raises(RequestError, match=problem):
        parse_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:y"}}, part]}])


def test_user_image_parts_reach_the_template_as_image_parts():
    from helios.frontend.preparation.image_parts import image_urls
    from helios.frontend.preparation.messages import parse_messages, template_messages

    parsed = parse_messages([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                          {"type": "image_url", "image_url": {"url": "data:1"}},
                                                          {"type": "text", "text": "b"}]}])
    assert parsed[0].content == "a\nb" and image_urls(parsed) == ["data:1"]
    assert template_messages(parsed, False)[0]["content"] == [
        {"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]
