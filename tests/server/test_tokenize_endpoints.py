"""vLLM's ``POST /tokenize``, ``POST /detokenize`` and ``GET /version`` on the tiny served core: a chat
tokenizes to its chat completion's prompt (and to transformers' ``apply_chat_template``), a text to its
completion's prompt, ids decode as transformers decodes them, and hostile bodies get typed 400s."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from tokenizers import Tokenizer, processors
from transformers import PreTrainedTokenizerFast

import helios
import helios.server.tokenize as tokenize_module
from helios.server.body_guard import OFF_LOOP_NBYTES
from helios.server.schemas import MAX_TEXT_PARTS
from helios.server.schemas_tokenize import MAX_DETOKENIZE_TOKENS
from helios.server.tokenize import special_tokens_around
from support.chat_checkpoint import CHAT_TEMPLATE
from support.server_core import CONTEXT_TOKENS, SERVED_ID

CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 12, "b": 30}'}}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
# (messages, request fields): each a chat whose prompt fits the context
CHATS = [
    ([{"role": "user", "content": "hello world"}], {}),
    ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 12 plus 30?"},
      {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "42"}], {"tools": TOOLS}),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the quick", "reasoning_content": "think"}],
     {"continue_final_message": True}),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the quick"}],
     {"add_generation_prompt": False}),
    ([{"role": "user", "content": [{"type": "text", "text": "the "}, {"type": "text", "text": "weather"}]}],
     {"chat_template_kwargs": {"enable_thinking": False}}),
]


def post(runner, app, path: str, body=None, content: bytes | None = None) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
            if content is not None:
                return await client.post(path, content=content, headers={"content-type": "application/json"})
            return await client.post(path, json=body)

    return runner.run(scenario())


def reference_tokenizer(tokenizer_json: bytes) -> PreTrainedTokenizerFast:
    """transformers' tokenizer of the core's tokenizer.json, with the checkpoint's chat template."""
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json.decode()),
                                   chat_template=CHAT_TEMPLATE)


def reference_messages(messages: list[dict]) -> list[dict]:
    """`messages` as transformers' templates take them: tool-call arguments as objects, text parts joined
    with newlines (as Helios joins them for a template that renders only strings)."""
    converted = []
    for message in messages:
        message = dict(message)
        if isinstance(message.get("content"), list):
            message["content"] = "\n".join(part["text"] for part in message["content"])
        if "tool_calls" in message:
            message["tool_calls"] = [{**call, "function": {**call["function"], "arguments": json.loads(
                call["function"]["arguments"])}} for call in message["tool_calls"]]
        converted.append(message)
    return converted


@pytest.mark.parametrize("messages, fields", CHATS, ids=["user", "tools", "continued", "closed", "parts"])
def test_a_chat_tokenizes_to_its_chat_completion_prompt(runner, app, tokenizer_json, messages, fields):
    answer = post(runner, app, "/tokenize", {"model": SERVED_ID, "messages": messages, **fields})
    assert answer.status_code == 200, answer.text
    result = answer.json()
    chat = post(runner, app, "/v1/chat/completions", {"model": SERVED_ID, "messages": messages, "max_tokens": 1,
                                                      "return_token_ids": True, **fields})
    assert chat.status_code == 200, chat.text
    assert result["tokens"] == chat.json()["prompt_token_ids"]
    assert result["count"] == chat.json()["usage"]["prompt_tokens"] == len(result["tokens"])
    assert result["max_model_len"] == CONTEXT_TOKENS and "token_strs" not in result
    options = {"add_generation_prompt": fields.get("add_generation_prompt", not fields.get("continue_final_message")),
               "continue_final_message": fields.get("continue_final_message", False),
               **fields.get("chat_template_kwargs", {})}
    expected = reference_tokenizer(tokenizer_json).apply_chat_template(
        reference_messages(messages), tools=fields.get("tools"), tokenize=True, **options)["input_ids"]
    assert result["tokens"] == expected


def test_client_markers_in_a_chat_tokenize_as_text_as_the_chat_prompt_does(runner, app):
    messages = [{"role": "user", "content": "a <|im_end|> b <think>"}]
    answer = post(runner, app, "/tokenize", {"messages": messages, "return_token_strs": True}).json()
    chat = post(runner, app, "/v1/chat/completions", {"model": SERVED_ID, "messages": messages, "max_tokens": 1,
                                                      "return_token_ids": True}).json()
    assert answer["tokens"] == chat["prompt_token_ids"]
    assert answer["token_strs"].count("<|im_end|>") == 1  # the template's own, closing the user turn


def test_a_text_tokenizes_to_its_completion_prompt(runner, app, tokenizer_json):
    reference = reference_tokenizer(tokenizer_json)
    prompt = "the quick brown <|im_start|> fox"  # markers in a completion prompt are control tokens
    answer = post(runner, app, "/tokenize", {"prompt": prompt, "return_token_strs": True}).json()
    completion = post(runner, app, "/v1/completions", {"model": SERVED_ID, "prompt": prompt, "max_tokens": 1,
                                                       "return_token_ids": True}).json()
    assert answer["tokens"] == completion["prompt_token_ids"] == reference.encode(prompt)
    assert answer["count"] == completion["usage"]["prompt_tokens"]
    assert answer["token_strs"] == reference.convert_ids_to_tokens(answer["tokens"])
    bare = post(runner, app, "/tokenize", {"prompt": prompt, "add_special_tokens": False}).json()
    assert bare["tokens"] == reference.encode(prompt, add_special_tokens=False)
    assert post(runner, app, "/tokenize", {"prompt": ""}).json() == {"count": 0, "max_model_len": CONTEXT_TOKENS,
                                                                     "tokens": []}


def test_a_prompt_longer_than_the_context_is_counted(runner, app, tokenizer_json):
    """A completion refuses the prompt; /tokenize counts it, so a client sees how much to cut."""
    prompt = "the quick brown fox jumps over the lazy dog " * 40
    answer = post(runner, app, "/tokenize", {"prompt": prompt})
    assert answer.status_code == 200, answer.text
    assert answer.json()["count"] == len(reference_tokenizer(tokenizer_json).encode(prompt)) > CONTEXT_TOKENS
    messages = [{"role": "user", "content": prompt}]
    assert post(runner, app, "/tokenize", {"messages": messages}).json()["count"] > CONTEXT_TOKENS
    refused = post(runner, app, "/v1/chat/completions", {"model": SERVED_ID, "messages": messages})
    assert refused.status_code == 400, refused.text


@pytest.mark.parametrize("field", ["prompt", "messages"])
def test_text_no_prompt_of_the_context_could_hold_is_refused_untokenized(runner, app, served, monkeypatch, field):
    """Megabytes of text take the tokenizer tens of seconds in a preparation slot; text beyond the
    completion's text bound gets its 400 before any tokenizing."""
    text = "the quick brown fox " * (CONTEXT_TOKENS * 20)  # more code points than any token list spells
    for part in ("_tokenizer", "_prompts"):  # used, either would fail the request (500)
        monkeypatch.setattr(served.frontend, part, object())
    body = {"prompt": text} if field == "prompt" else {"messages": [{"role": "user", "content": text}]}
    answer = post(runner, app, "/tokenize", body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == field and "context extent" in answer.json()["error"]["message"], answer.text


def test_ids_detokenize_as_transformers_decodes_them(runner, app, tokenizer_json):
    reference = reference_tokenizer(tokenizer_json)
    ids = reference.apply_chat_template([{"role": "user", "content": "hello, how are you today?"}],
                                        add_generation_prompt=True, tokenize=True)["input_ids"]
    answer = post(runner, app, "/detokenize", {"tokens": ids, "model": SERVED_ID})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"prompt": reference.decode(ids)}
    assert "<|im_start|>" in answer.json()["prompt"]  # special tokens kept, as vLLM's decode keeps them
    assert post(runner, app, "/detokenize", {"tokens": []}).json() == {"prompt": ""}
    assert post(runner, app, "/detokenize", {"tokens": [float(ids[0])]}).json() == {"prompt": reference.decode(ids[:1])}


@pytest.mark.parametrize("body", [{"prompt": "hello world"}, {"messages": [{"role": "user", "content": "hi"}]}],
                         ids=["text", "chat"])
def test_a_large_body_answers_as_a_small_one(runner, app, body):
    """A body of 64 KiB or more is validated off the event loop, and FastAPI validates the model that
    gave again: either form must be read as itself (it was refused as neither a text nor a chat)."""
    small = post(runner, app, "/tokenize", body)
    large = post(runner, app, "/tokenize", content=json.dumps(body).encode()[:-1] + b" " * OFF_LOOP_NBYTES + b"}")
    assert small.status_code == large.status_code == 200, large.text
    assert large.json() == small.json()
    ids = list(range(100)) * 200
    detokenized = post(runner, app, "/detokenize", {"tokens": ids})
    assert detokenized.status_code == 200 and len(json.dumps({"tokens": ids})) > OFF_LOOP_NBYTES, detokenized.text


def test_the_work_runs_in_a_preparation_thread(runner, app, monkeypatch):
    threads = []
    original = tokenize_module.tokenize_chat

    def noting(frontend, body):
        threads.append(threading.current_thread().name)
        return original(frontend, body)

    monkeypatch.setattr(tokenize_module, "tokenize_chat", noting)
    assert post(runner, app, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    assert len(threads) == 1 and threads[0].startswith("helios-prepare-"), threads


HOSTILE = [
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, 400, None),
    ("/tokenize", {}, 400, None),
    ("/tokenize", [], 400, None),
    ("/tokenize", {"prompt": 3}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "x", "stream": True}, 400, "stream"),
    ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
    ("/tokenize", {"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0]"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, 400, "tool_choice"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True}, 400,
     "continue_final_message"),
    ("/tokenize", {"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": True,
                   "add_generation_prompt": True}, 400, "continue_final_message"),
    ("/tokenize", {"messages": [{"role": "assistant", "content": "x"}],
                   "chat_template_kwargs": {"continue_final_message": "yes"}}, 400, "chat_template_kwargs"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS * 2}, 400, "tools"),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * (MAX_TEXT_PARTS + 1)}]},
     400, "messages[0].content"),
    ("/tokenize", {"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {**CALL, "function": {"name": "add", "arguments": "{not json"}}]}]}, 400, None),
    ("/tokenize", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400, None),
    ("/detokenize", {"tokens": [1, -2]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": [1, 2.5]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": ["1"]}, 400, "tokens[0]"),
    ("/detokenize", {"tokens": [True]}, 400, "tokens[0]"),
    ("/detokenize", {"tokens": 5}, 400, "tokens"),
    ("/detokenize", {}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, 2, 99999, 5000]}, 400, "tokens[2]"),
    ("/detokenize", {"tokens": [7, 2**32 + 1]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": [10**4000]}, 400, "tokens[0]"),
    ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model"),
]


@pytest.mark.parametrize("path, body, status, param", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_bodies_get_typed_errors(runner, app, path, body, status, param):
    answer = post(runner, app, path, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == status and error["type"] == "invalid_request_error", error
    if param is not None:
        assert error["param"] == param, error


def test_an_image_on_a_text_core_is_the_400_a_chat_completion_of_it_gets(runner, app):
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
    tokenized = post(runner, app, "/tokenize", {"model": SERVED_ID, "messages": messages})
    chat = post(runner, app, "/v1/chat/completions", {"model": SERVED_ID, "messages": messages, "max_tokens": 1})
    assert tokenized.status_code == chat.status_code == 400, (tokenized.text, chat.text)
    assert tokenized.json() == chat.json()
    assert "this model takes no images" in tokenized.json()["error"]["message"]


def test_hostile_raw_bodies_get_typed_errors(runner, app):
    surrogate = post(runner, app, "/tokenize", content=b'{"prompt": "a \\ud800 b"}')
    assert surrogate.status_code == 400 and "surrogate" in surrogate.json()["error"]["message"], surrogate.text
    in_chat = post(runner, app, "/tokenize", content=b'{"messages": [{"role": "user", "content": "\\udfff"}]}')
    assert in_chat.status_code == 400, in_chat.text
    assert post(runner, app, "/detokenize", content=b'{"tokens": [1, NaN]}').status_code == 400
    many = ("[" + ",".join(["0"] * (MAX_DETOKENIZE_TOKENS + 1)) + "]").encode()
    too_many = post(runner, app, "/detokenize", content=b'{"tokens": ' + many + b"}")
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "tokens", too_many.text


def test_special_tokens_go_around_the_text_as_the_post_processor_places_them():
    tokenizer = Tokenizer.from_str(reference_tokenizer_json())
    bos, eos = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A <|im_end|>", special_tokens=[("<|im_start|>", bos), ("<|im_end|>", eos)])
    assert special_tokens_around(tokenizer) == ((bos,), (eos,))
    for text in ("hello world", "a", ""):
        before, after = special_tokens_around(tokenizer)
        bare = tokenizer.encode(text, add_special_tokens=False).ids
        assert [*before, *bare, *after] == tokenizer.encode(text, add_special_tokens=True).ids
    tokenizer.post_processor = None
    assert special_tokens_around(tokenizer) == ((), ())


def reference_tokenizer_json() -> str:
    from support.chat_checkpoint import train_tokenizer

    return train_tokenizer().to_str()


def test_version_and_metrics(runner, app):
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            version = await client.get("/version")
            await client.post("/detokenize", json={"tokens": [1]})
            return version, await client.get("/metrics")

    version, metrics = runner.run(scenario())
    assert version.json() == {"version": helios.__version__}
    assert 'helios_http_responses_total{endpoint="version",status="200"}' in metrics.text
    assert 'endpoint="detokenize",status="200"' in metrics.text


def test_the_document_describes_the_endpoints(app):
    paths = app.openapi()["paths"]
    assert {"/tokenize", "/detokenize", "/version"} <= paths.keys()
    assert "422" not in paths["/tokenize"]["post"]["responses"]
