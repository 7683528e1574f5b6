"""``/tokenize`` and prompt log-probabilities on the tiny Qwen2.5-VL core, served in this process: a chat
with image parts tokenizes to the prompt its chat completion runs (each image's placeholder expanded to
its features), and prompt scores, which no vision-language core can compute, get a 400 that says so."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest

from helios.frontend.images.decode import ImageLimits
from helios.server.app import create_app

from .tiny_vl import IMAGE_TOKEN, image_bytes
from .vl_checkpoint import SERVED_ID, served_vl_core

pytest.importorskip("PIL.Image")
IMAGES = [image_bytes(90, 60, 11), image_bytes(40, 100, 12, "JPEG")]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with served_vl_core(tmp_path_factory.getbasetemp(), ImageLimits(max_images=2, max_bytes=256 * 1024)) as served:
        yield create_app(served)


def post(app, path: str, body: dict) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as client:
            return await client.post(path, json=body)

    return asyncio.run(scenario())


def user(*images: bytes, text: str = "Describe.") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(i).decode()}}
             for i in images]
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [*parts, {"type": "text",
                                                                                            "text": text}]}]


@pytest.mark.parametrize("count", [1, 2], ids=["one-image", "two-images"])
def test_a_chat_with_images_tokenizes_to_its_chat_completion_prompt(app, count):
    messages = user(*IMAGES[:count])
    answer = post(app, "/tokenize", {"model": SERVED_ID, "messages": messages})
    assert answer.status_code == 200, answer.text
    tokens = answer.json()["tokens"]
    chat = post(app, "/v1/chat/completions", {"model": SERVED_ID, "messages": messages, "max_tokens": 1,
                                              "temperature": 0, "return_token_ids": True})
    assert chat.status_code == 200, chat.text
    result = chat.json()
    assert tokens == result["prompt_token_ids"]
    assert answer.json()["count"] == result["usage"]["prompt_tokens"] == len(tokens)
    runs = [len(run) for run in "".join("i" if t == IMAGE_TOKEN else " " for t in tokens).split()]
    assert len(runs) == count and min(runs) > 1  # each placeholder expanded to its image's features


@pytest.mark.parametrize("path, fields, param", [
    ("/v1/chat/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
    ("/v1/completions", {"echo": True, "logprobs": 1}, "echo"),
], ids=["prompt-logprobs", "echo-logprobs"])
def test_prompt_scores_on_a_vision_core_are_a_400_that_names_no_remedy_prepare_refuses(app, path, fields, param):
    """The 400 said "prepare it with --scored-prefill", which `helios prepare` refuses for a
    vision-language checkpoint (it captures no scored-prefill program for one)."""
    body = {"model": SERVED_ID, "max_tokens": 1, **fields}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"})
    answer = post(app, path, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param
    assert "--scored-prefill" not in error["message"] and "a vision-language core has none" in error["message"], error
