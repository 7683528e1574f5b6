"""Client mistakes that were answered as if they made sense (session 68): each is now a typed 4xx
naming what to change, through the in-process app over the tiny core (`conftest.served`).

- a key twice in one JSON object (``max_tokens``, ``model``, a message's ``role``, a ``logit_bias``
  id): readers disagree on which holds, so it is refused rather than read as the last one;
- a message of more than `MAX_TEXT_PARTS` text parts, or an assistant message of more than
  `MAX_TOOL_CALLS` tool calls: refused by their count before admission and preparation (a request of
  a million parts was served, as long as its text fit the context);
- a body past the limit names ``--max-body-bytes``; without that flag, `helios serve` of a core file
  makes room for ``--max-images`` images of ``--max-image-bytes`` as base64 data: URLs (the 4 MiB
  default refused a request of four full-size images).
"""

from __future__ import annotations

import argparse
import base64
import json

import httpx
import pytest

from helios.cli import serve_cmd
from helios.server.app import create_app
from helios.server.defaults import DEFAULT_MAX_BODY_NBYTES
from helios.server.schemas import MAX_TEXT_PARTS, MAX_TOOL_CALLS
from support.server_core import SERVED_ID

CHAT = "/v1/chat/completions"


def post(runner, app, path: str, body: bytes) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
            return await client.post(path, content=body, headers={"content-type": "application/json"})

    return runner.run(scenario())


def encoded(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


USER = '{"role":"user","content":"hi"}'


@pytest.mark.parametrize("raw, key", [
    ('{"model":"%s","messages":[%s],"max_tokens":1,"max_tokens":2}', "max_tokens"),
    ('{"model":"%s","model":"another","messages":[%s],"max_tokens":1}', "model"),
    ('{"model":"%s","messages":[{"role":"user","role":"system","content":"hi"}],"max_tokens":1}', "role"),
    ('{"model":"%s","messages":[%s],"max_tokens":1,"logit_bias":{"7":1,"7":-100}}', "7"),
], ids=["max_tokens", "model", "role", "logit_bias"])
def test_a_key_given_twice_is_a_400_naming_it(runner, app, raw, key):
    body = (raw % ((SERVED_ID, USER) if raw.count("%s") == 2 else (SERVED_ID,))).encode()
    response = post(runner, app, CHAT, body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert f'the key "{key}" appears twice' in message, message


def test_a_message_of_too_many_text_parts_is_refused_by_its_count(runner, app):
    parts = [{"type": "text", "text": ""}] * (MAX_TEXT_PARTS + 1)
    response = post(runner, app, CHAT, encoded({"model": SERVED_ID, "max_tokens": 1,
                                                "messages": [{"role": "user", "content": parts}]}))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages[0].content", error
    assert f"has {MAX_TEXT_PARTS + 1} text parts; a message may have at most {MAX_TEXT_PARTS}" in error["message"]
    fits = post(runner, app, CHAT, encoded({"model": SERVED_ID, "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}] * 4}]}))
    assert fits.status_code == 200, fits.text


def _history(num_calls: int) -> list[dict]:
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(num_calls)]
    return [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c0", "content": "r"}]


def test_an_assistant_message_of_too_many_tool_calls_is_refused_by_its_count(runner, app):
    response = post(runner, app, CHAT, encoded({"model": SERVED_ID, "max_tokens": 1,
                                                "messages": _history(MAX_TOOL_CALLS + 1)}))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages[1].tool_calls", error
    assert f"has {MAX_TOOL_CALLS + 1} calls; an assistant message may have at most" in error["message"], error
    fits = post(runner, app, CHAT, encoded({"model": SERVED_ID, "max_tokens": 1, "messages": _history(3)}))
    assert fits.status_code == 200, fits.text


def test_a_body_past_the_limit_names_the_flag_that_sets_it(runner, app):
    body = encoded({"model": SERVED_ID, "messages": [{"role": "user", "content": "x" * DEFAULT_MAX_BODY_NBYTES}]})
    response = post(runner, app, CHAT, body)
    assert response.status_code == 413, response.text
    assert "--max-body-bytes" in response.json()["error"]["message"]


def _body_limit(*argv: str) -> int:
    """The body limit `helios serve` runs with for `argv` (its flags; --max-body-bytes or the default)."""
    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["serve", *argv])
    return args.max_body_bytes if args.max_body_bytes is not None else serve_cmd.default_body_limit(args)


def _images_body(num_images: int, image_nbytes: int) -> bytes:
    url = "data:image/jpeg;base64," + base64.b64encode(b"\xff" * image_nbytes).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}} for _ in range(num_images)]
    return encoded({"model": SERVED_ID, "max_tokens": 1, "messages": [
        {"role": "user", "content": [*parts, {"type": "text", "text": "Compare these pictures. " * 100}]}]})


@pytest.mark.parametrize("argv, num_images, image_nbytes", [
    ((), 4, 2 * 1024 * 1024),
    (("--max-images", "6", "--max-image-bytes", str(3 * 1024 * 1024)), 6, 3 * 1024 * 1024),
], ids=["image-defaults", "raised-image-flags"])
def test_the_default_body_limit_holds_the_images_the_image_flags_admit(runner, served, argv, num_images, image_nbytes):
    """A core file's server: as many full-size images as --max-images admits, with some text, get
    past the body limit (to this text core's own refusal of images)."""
    limit = _body_limit("model.core", *argv)
    body = _images_body(num_images, image_nbytes)
    assert len(body) <= limit
    response = post(runner, create_app(served, max_body_nbytes=limit), CHAT, body)
    assert response.status_code == 400, response.text
    assert "takes no images" in response.json()["error"]["message"]


def test_an_operators_body_limit_and_the_embedded_models_stay_as_they_are():
    assert _body_limit("model.core", "--max-body-bytes", "1000") == 1000
    assert _body_limit() == DEFAULT_MAX_BODY_NBYTES  # the embedded model takes no images
