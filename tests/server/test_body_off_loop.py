"""A large request body's work stays off the event loop, and its answers stay what they were.

`BodyGuard` reads and checks a body of `OFF_LOOP_NBYTES` or more in a thread with the cyclic
garbage collector paused; the route takes the value the guard read (the body is read as JSON once)
and validates a large one in a thread too; a bounded list of the request models is refused by its
length before any of its items is validated (pydantic applies ``max_length`` only after validating
every item). What is pinned here is the mechanism (which thread did the work, how many items were
validated, how often the body was read), never a duration.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import threading

import httpx
import pytest
from pydantic import BeforeValidator, ValidationError, create_model
from typing import Annotated

import helios.server.body_guard as body_guard
import helios.server.schemas as schemas
from fastapi.routing import APIRoute
from helios.server.schemas import ChatCompletionRequest, CompletionRequest
from support.server_core import SERVED_ID

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def post(runner, app, path: str, body) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post(path, content=as_json(body), headers={"content-type": "application/json"})

    return runner.run(scenario())


def answer(response: httpx.Response) -> tuple:
    error = response.json().get("error") or {}
    return response.status_code, error.get("type"), error.get("param"), error.get("message")


def as_json(body) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


LARGE_NBYTES = 128 * 1024  # a large body (at least `body_guard.OFF_LOOP_NBYTES`: see the test below)


def padded(body) -> bytes:
    """`body` as JSON of at least `LARGE_NBYTES` (blank space after it: the same value, a large body)."""
    text = as_json(body)
    return text + b" " * max(0, LARGE_NBYTES - len(text))


def test_padded_bodies_are_large():
    assert LARGE_NBYTES >= body_guard.OFF_LOOP_NBYTES


def calls_of(function_name: str, work) -> int:
    """How many times a Python function named `function_name` was entered while `work()` ran."""
    count = 0

    def profile(frame, event, _arg):
        nonlocal count
        if event == "call" and frame.f_code.co_name == function_name:
            count += 1

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count


# --- schemas: a list's length before its items ---------------------------------------------------

def token_id_validations(model, body: dict) -> int:
    """Token ids validated (`schemas._integral_number` runs once per id) while `body` is refused."""

    def validate():
        with pytest.raises(ValidationError) as raised:
            model.model_validate(body)
        assert raised.value.errors()[0]["type"] == "too_long"

    return calls_of(schemas._integral_number.__name__, validate)


def chat_with(**fields) -> dict:
    return {"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], **fields}


OVER_LONG_TOKEN_LISTS = {
    "prompt batch": (CompletionRequest, {"model": SERVED_ID, "prompt": [[0, 1, 2]] * (schemas.MAX_CHOICES + 1)}),
    "stop_token_ids": (ChatCompletionRequest, chat_with(stop_token_ids=[0] * 1000)),
    "stop_token_sequences": (ChatCompletionRequest, chat_with(stop_token_sequences=[[0, 1]] * 1000)),
    "one stop token sequence": (ChatCompletionRequest, chat_with(stop_token_sequences=[[0] * 1000])),
}


@pytest.mark.parametrize("case", list(OVER_LONG_TOKEN_LISTS))
def test_an_over_long_list_is_refused_before_any_item_is_validated(case):
    model, body = OVER_LONG_TOKEN_LISTS[case]
    assert token_id_validations(model, body) == 0


def test_a_list_within_its_bound_still_has_every_item_validated():
    body = {"model": SERVED_ID, "prompt": [[0, 1, 2]] * schemas.MAX_CHOICES}
    count = calls_of(schemas._integral_number.__name__, lambda: CompletionRequest.model_validate(body))
    assert count == 3 * schemas.MAX_CHOICES


def test_the_length_check_gives_pydantics_own_error():
    seen = []
    item = Annotated[int, BeforeValidator(lambda value: seen.append(value) or value)]
    Bounded = create_model("Bounded", items=(schemas.list_of(item, 2, min_len=1), ...))
    with pytest.raises(ValidationError) as raised:
        Bounded.model_validate({"items": [1, 2, 3]})
    (error,) = raised.value.errors(include_url=False)
    assert seen == []
    assert (error["type"], error["loc"], error["msg"]) == (
        "too_long", ("items",), "List should have at most 2 items after validation, not 3")
    with pytest.raises(ValidationError, match="at least 1 item"):
        Bounded.model_validate({"items": []})
    assert Bounded.model_validate({"items": [1, 2]}).items == [1, 2] and seen == [1, 2]


def bounded_lists(schema, parent=None):
    """Every list schema with a ``max_length`` in a pydantic core schema, with the schema around it."""
    if isinstance(schema, dict):
        if schema.get("type") == "list" and "max_length" in schema:
            yield schema, parent
        for value in schema.values():
            yield from bounded_lists(value, schema)
    elif isinstance(schema, list):
        for value in schema:
            yield from bounded_lists(value, parent)


@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest])
def test_every_bounded_list_of_the_request_models_is_checked_before_its_items(model):
    found = list(bounded_lists(model.__pydantic_core_schema__))
    assert len(found) >= 5
    for schema, parent in found:
        assert parent is not None and parent.get("type") == "function-before", schema


# --- the body guard and the route: large bodies off the loop -------------------------------------

@pytest.fixture
def recorded(monkeypatch):
    """Records, for each call of the body guard's JSON check and of a route's body validation, the
    thread it ran on, whether the garbage collector was on, and (validation) the value's type."""
    calls = []
    check = body_guard.check_json_text

    def recording_check(body):
        calls.append(("check", threading.get_ident(), gc.isenabled(), bytes))
        return check(body)

    monkeypatch.setattr(body_guard, "check_json_text", recording_check)
    return calls


@pytest.fixture
def recorded_validation(app, recorded, monkeypatch):
    for route in app.routes:
        if isinstance(route, APIRoute) and route.body_field is not None:
            validate = route.body_field.validate

            def recording_validate(value, *args, _validate=validate, **kwargs):
                recorded.append(("validate", threading.get_ident(), gc.isenabled(), type(value)))
                return _validate(value, *args, **kwargs)

            monkeypatch.setattr(route.body_field, "validate", recording_validate)
    return recorded


def loop_thread(runner) -> int:
    async def ident():
        return threading.get_ident()

    return runner.run(ident())


def test_a_large_body_is_checked_and_validated_off_the_loop_with_the_collector_paused(
        runner, app, recorded_validation):
    body = {"model": SERVED_ID, "prompt": [[0]] * 20000}  # an over-long batch: 400 at validation
    response = post(runner, app, COMPLETIONS, padded(body))
    assert response.status_code == 400, response.text
    loop = loop_thread(runner)
    kinds = [(kind, thread != loop, enabled) for kind, thread, enabled, _ in recorded_validation]
    assert kinds == [("check", True, False), ("validate", True, False)]
    assert gc.isenabled()


def test_a_valid_large_body_reaches_fastapi_as_the_model_validated_off_the_loop(runner, app, recorded_validation):
    body = {"model": SERVED_ID, "prompt": "hello", "max_tokens": 2}
    response = post(runner, app, COMPLETIONS, padded(body))
    assert response.status_code == 200, response.text
    loop = loop_thread(runner)
    off_loop = [(kind, value_type) for kind, thread, _, value_type in recorded_validation if thread != loop]
    on_loop = [(kind, value_type) for kind, thread, _, value_type in recorded_validation if thread == loop]
    assert off_loop == [("check", bytes), ("validate", dict)]
    assert on_loop == [("validate", CompletionRequest)]  # FastAPI's own validation takes the model as it is


def test_a_small_body_is_checked_and_validated_on_the_loop(runner, app, recorded_validation):
    response = post(runner, app, COMPLETIONS, {"model": SERVED_ID, "prompt": "hello", "max_tokens": 2})
    assert response.status_code == 200, response.text
    loop = loop_thread(runner)
    assert [(kind, thread == loop, value_type) for kind, thread, _, value_type in recorded_validation] == [
        ("check", True, bytes), ("validate", True, dict)]


def test_the_body_is_read_as_json_once(runner, app, monkeypatch):
    reads = []
    loads = json.loads

    def counting_loads(*args, **kwargs):
        reads.append(1)
        return loads(*args, **kwargs)

    monkeypatch.setattr(json, "loads", counting_loads)
    for body in ({"model": SERVED_ID, "prompt": "hi", "max_tokens": 1},
                 padded({"model": SERVED_ID, "prompt": "hi", "max_tokens": 1})):
        reads.clear()
        response = post(runner, app, COMPLETIONS, body)
        assert response.status_code == 200, response.text
        assert len(reads) == 1


def test_the_collector_pause_ends_with_its_last_holder_and_keeps_a_collector_that_was_off():
    pause = body_guard._CyclicGCPause()
    assert gc.isenabled()
    with pause:
        with pause:
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with pause:
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_run_off_loop_runs_the_work_in_another_thread_and_passes_its_error_on():
    async def scenario():
        loop = threading.get_ident()
        assert await body_guard.run_off_loop(threading.get_ident) != loop
        with pytest.raises(body_guard.MalformedBody):
            await body_guard.run_off_loop(body_guard.check_json_text, b"[NaN]")

    asyncio.run(scenario())
    assert gc.isenabled()


# --- the answers are what they were ---------------------------------------------------------------

U = [{"role": "user", "content": "hi"}]
TOO_MANY = "List should have at most {} items after validation, not {}"
ANSWERS = {
    "over-long prompt batch": (
        COMPLETIONS, {"model": SERVED_ID, "prompt": [[0]] * 40},
        (400, "invalid_request_error", "prompt", "invalid request body: prompt: " + TOO_MANY.format(16, 40))),
    "over-long text batch": (
        COMPLETIONS, {"model": SERVED_ID, "prompt": ["a"] * 17},
        (400, "invalid_request_error", "prompt", "invalid request body: prompt: " + TOO_MANY.format(16, 17))),
    "bad token in a batch": (
        COMPLETIONS, {"model": SERVED_ID, "prompt": [[0], [-1]]},
        (400, "invalid_request_error", "prompt[1][0]",
         "invalid request body: prompt[1][0]: Input should be greater than or equal to 0")),
    "over-long stop (a union)": (
        CHAT, {"model": SERVED_ID, "messages": U, "stop": ["a"] * 9},
        (400, "invalid_request_error", "stop",
         "invalid request body: stop: Input should be a valid string; stop: " + TOO_MANY.format(4, 9))),
    "over-long stop_token_ids": (
        CHAT, {"model": SERVED_ID, "messages": U, "stop_token_ids": [-1] * 40},
        (400, "invalid_request_error", "stop_token_ids",
         "invalid request body: stop_token_ids: " + TOO_MANY.format(16, 40))),
    "over-long stop token sequence": (
        CHAT, {"model": SERVED_ID, "messages": U, "stop_token_sequences": [[0] * 100]},
        (400, "invalid_request_error", "stop_token_sequences[0]",
         "invalid request body: stop_token_sequences[0]: " + TOO_MANY.format(64, 100))),
    "over-long messages": (
        CHAT, {"model": SERVED_ID, "messages": [{"role": "x"}] * 1100},
        (400, "invalid_request_error", "messages", "invalid request body: messages: " + TOO_MANY.format(1024, 1100))),
    "no messages": (
        CHAT, {"model": SERVED_ID, "messages": []},
        (400, "invalid_request_error", "messages",
         "invalid request body: messages: List should have at least 1 item after validation, not 0")),
    "over-long choices": (
        CHAT, {"model": SERVED_ID, "messages": U, "response_format": {"type": "choice", "choices": [""] * 300}},
        (400, "invalid_request_error", "response_format.choices",
         "invalid request body: response_format.choices: " + TOO_MANY.format(256, 300))),
    "metadata (a dict: items first)": (
        CHAT, {"model": SERVED_ID, "messages": U, "metadata": {str(i): "v" for i in range(20)}},
        (400, "invalid_request_error", "metadata",
         "invalid request body: metadata: Dictionary should have at most 16 items after validation, not more")),
    "lone surrogate": (
        CHAT, b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
        (400, "invalid_request_error", None,
         "the request body holds a lone surrogate (\\ud800), which is not Unicode text")),
    "too deep": (
        CHAT, b'{"a": ' + b"[" * 70 + b"]" * 70 + b"}",
        (400, "invalid_request_error", None, "the request body nests deeper than 64 levels")),
    "NaN": (
        CHAT, b'{"model": NaN}',
        (400, "invalid_request_error", None, "the request body is not strict JSON: NaN is not a JSON value")),
    "not an object": (
        COMPLETIONS, b"[1, 2]",
        (400, "invalid_request_error", None, "invalid request body: Input should be a valid dictionary or object "
         "to extract fields from")),
    "model not served": (
        COMPLETIONS, {"model": "other", "prompt": "hi"},
        (404, "invalid_request_error", "model", f"model 'other' is not served here; use '{SERVED_ID}'")),
}


@pytest.mark.parametrize("is_large", [False, True], ids=["small", "large"])
@pytest.mark.parametrize("case", list(ANSWERS))
def test_answers_are_the_same_for_small_and_large_bodies(runner, app, case, is_large):
    path, body, expected = ANSWERS[case]
    response = post(runner, app, path, padded(body) if is_large else body)
    assert answer(response) == expected, response.text
