"""What a POST to a route that takes no body, or to no route, is answered, and what an empty body is
told: the path is judged before the body (a 404 or 405, never a 415 or a JSON error about a body no
route reads), and an empty body gets a message that says so."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from support.server_core import SERVED_ID


def call(app, method: str, path: str, body: bytes, content_type: str | None) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            headers = {} if content_type is None else {"content-type": content_type}
            return await client.request(method, path, content=body, headers=headers)

    return asyncio.run(scenario())


BODIES = {
    "plain text": (b"hello", "text/plain"),
    "no media type": (b"{}", None),
    "invalid UTF-8": (b"\xff\xfe", "application/json"),
    "not JSON": (b"{", "application/json"),
    "a lone surrogate": (b'{"a": "\\ud800"}', "application/json"),
}


@pytest.mark.parametrize("case", list(BODIES))
@pytest.mark.parametrize(("path", "status"), [("/v1/embeddings", 404), ("/health", 405), ("/v1/models", 405)])
def test_a_post_to_a_route_that_takes_no_body_is_judged_by_its_path(app, case, path, status):
    """BodyGuard judged every POST's body first: 415 or 400 where the path was the mistake."""
    body, content_type = BODIES[case]
    response = call(app, "POST", path, body, content_type)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == status


def test_the_completion_routes_still_judge_the_body(app):
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert call(app, "POST", path, b"hello", "text/plain").status_code == 415
        assert call(app, "POST", path, b"\xff\xfe", "application/json").status_code == 400


def test_a_post_over_the_size_limit_is_413_whatever_its_path(served):
    from helios.server.app import create_app

    app = create_app(served, max_body_nbytes=1024)
    assert call(app, "POST", "/v1/embeddings", b"x" * 4096, "text/plain").status_code == 413


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_empty_body_is_told_it_is_empty(app, path):
    """It was "invalid request body: Field required", naming no field."""
    response = call(app, "POST", path, b"", "application/json")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"] == "the request body is empty: send a JSON object of the endpoint's fields"
    assert error["type"] == "invalid_request_error" and error["param"] is None


def test_a_body_of_json_null_is_still_a_schema_violation(app):
    response = call(app, "POST", "/v1/completions", json.dumps(None).encode(), "application/json")
    assert response.status_code == 400 and "valid dictionary" in response.json()["error"]["message"]
    response = call(app, "POST", "/v1/completions", json.dumps({"model": SERVED_ID}).encode(), "application/json")
    assert response.json()["error"]["message"] == "invalid request body: prompt: Field required"
