"""What error messages say: a schema violation names its place in the body as a client writes it
(``prompt[0]``, ``messages[0].content[0].text``), never pydantic's union-member tags or validator
reprs with heap addresses; client text echoed back (a path, a number, a key) is bounded; a regex
error keeps its detail line."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest

from helios.server import app as app_module
from helios.server.app import create_app, schema_violation
from helios.server.echo import MAX_ECHO_CHARS, clipped, clipped_runs
from support.server_core import SERVED_ID, served_tiny_core


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, frontend_workers=2) as served:
        yield create_app(served)


def call(app, method: str, path: str, body=None, content_type: str | None = "application/json") -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            content = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            headers = {} if content_type is None else {"content-type": content_type}
            return await client.request(method, path, content=content, headers=headers)

    return asyncio.run(scenario())


def chat(**fields) -> dict:
    return {"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], **fields}


def error_of(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.mark.parametrize(("prompt", "message", "param"), [
    ([-1], "prompt[0]: Input should be greater than or equal to 0", "prompt[0]"),
    ([True], "prompt[0]: Input should be a valid integer", "prompt[0]"),
    (["a", [1, 2]], "prompt[1]: Input should be a valid string", "prompt[1]"),
    ([[1, -2]], "prompt[0][1]: Input should be greater than or equal to 0", "prompt[0][1]"),
])
def test_a_bad_prompt_is_named_by_its_place_only(app, prompt, message, param):
    error = error_of(call(app, "POST", "/v1/completions", {"model": SERVED_ID, "prompt": prompt}))
    assert error["message"] == f"invalid request body: {message}"
    assert error["param"] == param


@pytest.mark.parametrize(("body", "places"), [
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
     ["messages[0].content: Input should be a valid string", "messages[0].content[0].text:"]),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "r"}}),
     ["response_format.json_schema.schema: Field required"]),
    (chat(tools=[{"type": "function", "function": {"parameters": {}}}]), ["tools[0].function.name: Field required"]),
    (chat(stop=[1]), ["stop: Input should be a valid string", "stop[0]: Input should be a valid string"]),
    (chat(chat_template_kwargs={"a.b": [1]}), ['chat_template_kwargs["a.b"]: Input should be a valid boolean']),
    (chat(logit_bias={"x": 1}), ["logit_bias.x: String should match pattern"]),
])
def test_locations_are_paths_of_the_body_without_union_tags(app, body, places):
    message = error_of(call(app, "POST", "/v1/chat/completions", body))["message"]
    for place in places:
        assert place in message, message
    for internal in ("function-", "list[", "constrained-str", "tagged-union", ".user.", "[key]", " at 0x"):
        assert internal not in message, message


IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


@pytest.mark.parametrize(("message", "says"), [
    ({"role": "system", "content": [{"type": "text", "text": "look"}, IMAGE_PART]}, "a system or developer message"),
    ({"role": "developer", "content": [IMAGE_PART]}, "a system or developer message"),
    ({"role": "assistant", "content": [IMAGE_PART]}, "an assistant message"),
    ({"role": "tool", "tool_call_id": "call_1", "content": [IMAGE_PART]}, "a tool message"),
], ids=["system", "developer", "assistant", "tool"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_an_image_part_outside_a_user_message_says_where_images_belong(app, path, message, says):
    """Validated as text parts, an image part there was four errors ending in "image_url: not a field
    this server accepts", which read as images not being served at all."""
    body = chat(messages=[message, {"role": "user", "content": "hi"}])
    error = error_of(call(app, "POST", path, body))
    index = len(message["content"]) - 1
    assert error["message"] == (f"invalid request body: messages[0].content: part {index} is an image_url part; "
                                f"image parts belong in user messages ({says} takes a text or text parts)")
    assert error["param"] == "messages[0].content"


def test_without_the_body_only_field_names_and_indices_are_kept():
    entry = {"loc": ("body", "prompt", "list[function-after[functools.partial(<function v at 0x7f>)]]", 0),
             "msg": "Input should be greater than or equal to 0", "type": "greater_than_equal"}
    violation = schema_violation([entry])
    assert str(violation) == "invalid request body: prompt[0]: Input should be greater than or equal to 0"


def test_echoed_client_text_is_bounded(app, caplog):
    caplog.set_level(logging.INFO, logger="helios.access")
    model_id = "m" * 60_000
    response = call(app, "GET", f"/v1/models/{model_id}")
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert len(message) < 3 * MAX_ECHO_CHARS and "(60,000 characters)" in message
    (line,) = [r.getMessage() for r in caplog.records if r.name == "helios.access"]
    assert len(line) < 3 * MAX_ECHO_CHARS and "(60,011 characters)" in line  # /v1/models/ and the id

    digits = "9" * 4000
    body = json.dumps(chat()).encode()[:-1] + b', "max_tokens": ' + digits.encode() + b"}"
    message = error_of(call(app, "POST", "/v1/chat/completions", body))["message"]
    assert "max_tokens" in message and digits not in message and "characters)" in message
    assert len(message) < 3 * MAX_ECHO_CHARS

    field = "f" * 10_000
    error = error_of(call(app, "POST", "/v1/chat/completions", {**chat(), field: 1}))
    assert len(error["message"]) < 3 * MAX_ECHO_CHARS and len(error["param"]) < 2 * MAX_ECHO_CHARS


def test_the_access_log_escapes_the_path(app, caplog):
    caplog.set_level(logging.INFO, logger="helios.access")
    call(app, "GET", '/v1/models/a%0A"b')
    (line,) = [r.getMessage() for r in caplog.records if r.name == "helios.access"]
    assert "\n" not in line and '"GET /v1/models/a\\n\\"b" 404' in line


def test_clipping_keeps_short_text_and_the_words_around_a_long_value():
    assert clipped("short") == "short"
    assert clipped("x" * 300) == "x" * MAX_ECHO_CHARS + "... (300 characters)"
    assert clipped_runs(f"max_tokens ({'9' * 500}) exceed") == f"max_tokens ({'9' * 199}... (502 characters) exceed"


def test_an_invalid_schema_pattern_names_what_is_wrong(app):
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}, "required": ["a"]}
    body = chat(response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
    message = error_of(call(app, "POST", "/v1/chat/completions", body))["message"]
    assert "regex parse error" in message and "unclosed group" in message, message


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "application/jsonx", "text/json", None])
def test_a_body_sent_as_another_media_type_or_none_is_415_naming_it(app, content_type):
    response = call(app, "POST", "/v1/chat/completions", chat(max_tokens=1), content_type=content_type)
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 415
    sent = f"this request's: {content_type!r}" if content_type else "this request has none"
    assert error["message"] == f"the request body must be JSON sent with Content-Type: application/json ({sent})"


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON",
                                          "application/vnd.api+json"])
def test_json_media_types_are_read_as_json(app, content_type):
    response = call(app, "POST", "/v1/chat/completions", chat(max_tokens=1), content_type=content_type)
    assert response.status_code == 200, response.text
    response = call(app, "POST", "/v1/chat/completions", chat(max_tokens=0), content_type=content_type)
    assert response.status_code == 400, response.text  # a schema violation is still a 400


@pytest.mark.parametrize("content_type", ["application/json;charset=UTF-8", 'application/json; charset="utf-8"',
                                          "application/json; charset=utf8", "application/vnd.api+json; charset=utf-8",
                                          # an ASCII body reads alike under these (Java clients send ISO-8859-1)
                                          "application/json; charset=us-ascii", "application/json; charset=ISO-8859-1"])
def test_a_utf8_charset_is_read_as_json(app, content_type):
    response = call(app, "POST", "/v1/chat/completions", chat(max_tokens=1), content_type=content_type)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("charset", "encoding"), [("latin-1", "latin-1"), ("ISO-8859-1", "latin-1"),
                                                   ('"utf-16"', "utf-16"), ("utf-32", "utf-32")])
def test_a_body_labelled_with_another_charset_is_415_naming_it(app, charset, encoding):
    # "Ã©" in latin-1 is the bytes C3 A9, valid UTF-8 for "é": read as UTF-8 regardless, it was served as other text.
    text = json.dumps(chat(max_tokens=1, messages=[{"role": "user", "content": "Ã©"}]), ensure_ascii=False)
    response = call(app, "POST", "/v1/chat/completions", text.encode(encoding),
                    content_type=f"application/json; charset={charset}")
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 415
    assert f"names charset {charset.strip(chr(34))!r}" in error["message"] and "UTF-8" in error["message"]


def test_a_body_of_many_errors_describes_four_and_counts_the_rest(app):
    error = error_of(call(app, "POST", "/v1/completions", {"model": SERVED_ID, "prompt": [-1] * 20_000}))
    message = error["message"]
    assert message.count("Input should be greater than or equal to 0") == 4, message
    assert message.endswith("(and 19996 more)"), message
    assert "prompt[3]" in message and "prompt[4]" not in message


def test_union_repeats_are_described_once_and_the_scan_is_bounded(monkeypatch):
    entry = {"loc": ("body", "prompt", 0), "msg": "Input should be greater than or equal to 0", "type": "x"}
    violation = schema_violation([entry, dict(entry), dict(entry)])
    assert str(violation) == "invalid request body: prompt[0]: Input should be greater than or equal to 0"

    described = []
    monkeypatch.setattr(app_module, "_describe", lambda entry, body: described.append(entry) or "same")
    violation = schema_violation([dict(entry) for _ in range(100_000)])  # one description, repeated
    assert len(described) == app_module.DESCRIBED_ERRORS_SCANNED
    assert str(violation) == f"invalid request body: same (and {100_000 - app_module.DESCRIBED_ERRORS_SCANNED} more)"


@pytest.mark.parametrize(("body", "content_type"), [(b"model=x&prompt=hi", "application/x-www-form-urlencoded"),
                                                    (b"hello", "text/plain"), (b"\xff\xfe", None)])
def test_a_body_that_is_not_json_either_is_415_not_a_json_error(app, body, content_type):
    response = call(app, "POST", "/v1/completions", body, content_type=content_type)
    assert response.status_code == 415, response.text
    assert "Content-Type: application/json" in response.json()["error"]["message"]
