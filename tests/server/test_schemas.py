"""Request-body validation: every rejected shape raises a typed error (HTTP 400), never a crash."""

from __future__ import annotations

import pydantic
import pytest

from helios.errors import RequestError
from helios.frontend.decoding.observation import ObservationOptionError
from helios.frontend.preparation.request_options import ChatOptionError, parse_body_stops
from helios.frontend.decoding.stops import StopOptionError
from helios.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    validate_chat,
    validate_common,
)

VOCAB = 1000


def chat(**fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return ChatCompletionRequest.model_validate(body)


def test_a_number_with_no_fraction_is_an_integer():
    # JSON Schema's "integer", the OpenAPI document's type, includes 2.0; booleans and strings do not
    assert chat(n=2.0, max_tokens=3.0, stop_token_ids=[5.0]).n == 2
    for value in (True, "2"):
        with pytest.raises(pydantic.ValidationError):
            chat(n=value)


def test_minimal_chat_request_is_valid():
    body = chat()
    validate_chat(body, VOCAB)
    assert body.messages[0].role == "user"


def test_assistant_history_takes_reasoning_under_either_name():
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r"}]
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": history})
    assert body.model_dump(exclude_none=True)["messages"][1] == history[1]


@pytest.mark.parametrize(
    "fields",
    [
        {"logit_bias": {"x": 2}},  # a key that is not a token id
        {"logit_bias": {"1": 101}},  # beyond OpenAI's [-100, 100]
        {"n": 17},
        {"temperature": -1},
        {"temperature": "hot"},
        {"max_tokens": 0},
        {"top_p": -0.1},  # 0 is in range (the most probable token alone)
        {"stream": "yes"},
        {"return_token_ids": 1},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"response_format": {"type": "xml"}},
        {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
        {"stop_token_ids": ["a"]},
        # bounds the OpenAPI document states (the same as the frontend's own checks)
        {"stop": ["a", "b", "c", "d", "e"]},
        {"stop": ["a", ""]},
        {"stop": ""},
        {"stop_token_ids": [-1]},
        {"stop_token_ids": [1] * 17},
        {"stop_token_sequences": [[1]] * 17},
        {"stop_token_sequences": [[1] * 65]},
        {"stop_token_sequences": [[]]},
        {"messages": [{"role": "tool", "content": "x", "tool_call_id": ""}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"id": "", "function": {"name": "f", "arguments": "{}"}}]}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "", "arguments": "{}"}}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}]},
        {"response_format": {"type": "choice", "choices": ["a", ""]}},
        {"n": 1.5},
    ],
)
def test_malformed_bodies_fail_schema_validation(fields):
    with pytest.raises(pydantic.ValidationError):
        chat(**fields)


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"stop": "x" * 4097}, "4096"),
        ({"stop": "x", "stop_token_ids": [1]}, "cannot be combined"),
        ({"stop_token_ids": [VOCAB]}, r"token ids in \[0, 1000\)"),
        ({"stop_token_sequences": [[1]] * 16, "stop_token_ids": [2]}, "together accept at most 16"),
        ({"return_token_timestamps": True}, "requires return_token_ids"),
        ({"stream_options": {"include_usage": True}}, "only allowed when stream"),
        ({"stop": "x", "response_format": {"type": "json_object"}}, "structured output"),
        ({"max_tokens": 3, "max_completion_tokens": 4}, "not both"),
        ({"tool_choice": "required"}, "at least one tool"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "undeclared"),
    ],
)
def test_semantic_rules_raise_request_errors(fields, fragment):
    with pytest.raises(RequestError, match=fragment):
        validate_chat(chat(**fields), VOCAB)


@pytest.mark.parametrize("error", [StopOptionError, ObservationOptionError, ChatOptionError])
def test_rule_errors_map_to_http_400(error):
    assert issubclass(error, RequestError) and error("x").http_status == 400


def test_stop_normalisation():
    assert parse_body_stops(chat(), VOCAB).strings == ()
    assert parse_body_stops(chat(stop=[]), VOCAB).strings == ()
    assert parse_body_stops(chat(stop="ab"), VOCAB).strings == ("ab",)
    assert parse_body_stops(chat(stop=["a", "b"]), VOCAB).strings == ("a", "b")
    assert parse_body_stops(chat(stop_token_ids=[3], stop_token_sequences=[[1, 2]]), VOCAB).token_sequences == ((1, 2),)


def test_null_observation_flags_mean_false():
    body = chat(return_token_ids=None, return_token_timestamps=None, stream_options=None)
    validate_chat(body, VOCAB)


def test_completion_request_accepts_text_or_ids():
    CompletionRequest.model_validate({"model": "m", "prompt": "hello"})
    body = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3]})
    validate_common(body, VOCAB)
    with pytest.raises(pydantic.ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "echo": "yes"})
