"""Assistant prefill over HTTP (vLLM's ``continue_final_message`` / ``add_generation_prompt``) on the
tiny core: the prompt is transformers' continuation of the final assistant message, and every
response form (JSON, stream, ``n``, logprobs) holds only the new text."""

from __future__ import annotations

import json

import httpx
import pytest
from tokenizers import Tokenizer
from transformers.utils import chat_template_utils

from support.chat_checkpoint import CHAT_TEMPLATE
from support.server_core import SERVED_ID, post_chats

PREFILL = [{"role": "user", "content": "what is 12 plus 30? " * 8},
           {"role": "assistant", "content": "the quick brown fox"}]


def body(**fields) -> dict:
    return {"model": SERVED_ID, "messages": PREFILL, "max_tokens": 4, "temperature": 0, "return_token_ids": True,
            **fields}


def reference_ids(tokenizer_json: bytes, messages: list[dict], **options) -> list[int]:
    rendered, _ = chat_template_utils.render_jinja_template([messages], chat_template=CHAT_TEMPLATE, **options)
    return Tokenizer.from_str(tokenizer_json.decode()).encode(rendered[0], add_special_tokens=False).ids


def streamed(app, request: dict) -> list[dict]:
    import asyncio

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
            response = await client.post("/v1/chat/completions", json={**request, "stream": True})
            assert response.status_code == 200, response.text
            return [json.loads(line[6:]) for line in response.text.splitlines()
                    if line.startswith("data: {")]

    return asyncio.run(scenario())


def test_the_prompt_continues_the_final_message(app, tokenizer_json):
    (response,) = post_chats(app, body(continue_final_message=True))
    assert response.status_code == 200, response.text
    result = response.json()
    expected = reference_ids(tokenizer_json, PREFILL, continue_final_message=True)
    assert result["prompt_token_ids"] == expected
    assert result["usage"]["prompt_tokens"] == len(expected)
    # the same prompt through chat_template_kwargs, as vLLM merges them over the request fields
    (by_kwargs,) = post_chats(app, body(chat_template_kwargs={"continue_final_message": True}))
    assert by_kwargs.json()["prompt_token_ids"] == expected
    assert by_kwargs.json()["reused_prompt_tokens"] > 0  # the prompt cache serves the repeated prefix
    # without the generation prompt, the conversation ends after the closed assistant message
    (closed,) = post_chats(app, body(add_generation_prompt=False))
    assert closed.json()["prompt_token_ids"] == reference_ids(tokenizer_json, PREFILL)


def test_every_response_form_holds_only_the_new_text(app, tokenizer_json):
    tokenizer = Tokenizer.from_str(tokenizer_json.decode())
    (response,) = post_chats(app, body(continue_final_message=True, n=2, logprobs=True, top_logprobs=1))
    assert response.status_code == 200, response.text
    result = response.json()
    for choice in result["choices"]:
        new_text = tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
        assert choice["message"]["content"] == new_text
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    chunks = streamed(app, body(continue_final_message=True))
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])
    assert text == result["choices"][0]["message"]["content"]


@pytest.mark.parametrize("fields, param", [
    ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
    ({"continue_final_message": True, "messages": PREFILL[:1]}, "continue_final_message"),
    ({"add_generation_prompt": True, "chat_template_kwargs": {"continue_final_message": True}},
     "continue_final_message"),
    ({"continue_final_message": True, "chat_template_kwargs": {"continue_final_message": False}}, None),
    ({"continue_final_message": "yes"}, "continue_final_message"),
])
def test_options_that_cannot_apply_are_400s(app, fields, param):
    (response,) = post_chats(app, body(**fields))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert param is None or error["param"] == param, error
