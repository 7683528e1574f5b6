"""Request-body validation: every rejected shape raises a typed error (HTTP 400), never a crash."""

from __future__ import annotations

import pydantic
import pytest

from helios.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    InvalidRequest,
    stop_strings,
    validate_chat,
    validate_common,
)

VOCAB = 1000


def chat(**fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return ChatCompletionRequest.model_validate(body)


def test_minimal_chat_request_is_valid():
    body = chat()
    validate_chat(body, VOCAB)
    assert body.messages[0].role == "user"


@pytest.mark.parametrize(
    "fields",
    [
        {"logit_bias": {"1": 2}},  # unsupported OpenAI field: rejected, not ignored
        {"n": 2},
        {"temperature": -1},
        {"temperature": "hot"},
        {"max_tokens": 0},
        {"top_p": 0},
        {"stream": "yes"},
        {"return_token_ids": 1},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"response_format": {"type": "xml"}},
        {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
        {"stop_token_ids": ["a"]},
    ],
)
def test_malformed_bodies_fail_schema_validation(fields):
    with pytest.raises(pydantic.ValidationError):
        chat(**fields)


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
        ({"stop": ["a", ""]}, "non-empty"),
        ({"stop": "x" * 4097}, "4096"),
        ({"stop": "x", "stop_token_ids": [1]}, "cannot be combined"),
        ({"stop_token_ids": [VOCAB]}, "outside the vocabulary"),
        ({"stop_token_sequences": [[1]] * 17}, "at most 16"),
        ({"stop_token_sequences": [[1] * 65]}, "1 to 64"),
        ({"stop_token_sequences": [[]]}, "1 to 64"),
        ({"return_token_timestamps": True}, "requires return_token_ids"),
        ({"stream_options": {"include_usage": True}}, "only allowed when stream"),
        ({"stop": "x", "response_format": {"type": "json_object"}}, "structured output"),
        ({"max_tokens": 3, "max_completion_tokens": 4}, "not both"),
        ({"tool_choice": "required"}, "at least one tool"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "undeclared"),
    ],
)
def test_semantic_rules_raise_invalid_request(fields, fragment):
    with pytest.raises(InvalidRequest, match=fragment):
        validate_chat(chat(**fields), VOCAB)


def test_invalid_request_maps_to_http_400():
    assert InvalidRequest("x").http_status == 400


def test_stop_normalisation():
    assert stop_strings(None) == ()
    assert stop_strings([]) == ()
    assert stop_strings("ab") == ("ab",)
    assert stop_strings(["a", "b"]) == ("a", "b")


def test_null_observation_flags_mean_false():
    body = chat(return_token_ids=None, return_token_timestamps=None, stream_options=None)
    validate_chat(body, VOCAB)


def test_completion_request_accepts_text_or_ids():
    CompletionRequest.model_validate({"model": "m", "prompt": "hello"})
    body = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3]})
    validate_common(body, VOCAB)
    with pytest.raises(pydantic.ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "echo": True})
