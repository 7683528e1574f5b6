"""What the HTTP surface answers to requests a client gets slightly wrong: a path with a trailing
slash gets a JSON 404 naming the route (Starlette's 307 redirect built its Location from the
request's Host header, a client-chosen host, and had an empty body), and a body sent with a
Content-Encoding (or a Transfer-Encoding other than chunked) the server does not decode gets a JSON
415 with ``Accept-Encoding: identity`` (a gzip body was refused as invalid UTF-8, and a plain body
labelled gzip was served), and a body sent with two Content-Type headers gets a JSON 400 (the first
was taken)."""

from __future__ import annotations

import asyncio
import gzip
import json

import httpx
import pytest

from support.server_core import SERVED_ID

CHAT = json.dumps({"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()


def call(app, method: str, path: str, body: bytes = b"", **headers: str) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, content=body or None,
                                        headers={name.replace("_", "-"): value for name, value in headers.items()})

    return asyncio.run(scenario())


def assert_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == status and error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize(("method", "path", "route"), [
    ("POST", "/v1/chat/completions/", "/v1/chat/completions"),
    ("POST", "/v1/completions/", "/v1/completions"),
    ("GET", "/health/", "/health"),
    ("GET", "/metrics//", "/metrics"),
])
def test_a_trailing_slash_gets_a_json_404_naming_the_route_and_no_redirect_to_the_host_header(app, method, path,
                                                                                             route):
    body = CHAT if method == "POST" else b""
    response = call(app, method, path, body, host="attacker.example", content_type="application/json")
    error = assert_error(response, 404)
    assert "location" not in response.headers
    assert "attacker.example" not in response.text
    assert error["message"] == (f"Not Found: {method} {path} (this server's paths take no trailing slash: "
                                f"{method} {route})")


def test_other_unknown_paths_keep_the_plain_404(app):
    assert assert_error(call(app, "GET", "/v1/embeddings/", host="attacker.example"), 404)["message"] == "Not Found"
    assert assert_error(call(app, "GET", "/nothing"), 404)["message"] == "Not Found"


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate, gzip", "identity, gzip"])
def test_a_body_with_a_content_encoding_gets_a_json_415(app, encoding):
    """A plain JSON body labelled as compressed was served as if it were not."""
    response = call(app, "POST", "/v1/chat/completions", CHAT, content_type="application/json",
                    content_encoding=encoding)
    error = assert_error(response, 415)
    assert response.headers["accept-encoding"] == "identity"
    assert f"(this request's: {encoding!r})" in error["message"] and "uncompressed" in error["message"]


@pytest.mark.parametrize("codings", ["gzip, chunked", "br"])
def test_a_body_with_a_transfer_coding_other_than_chunked_gets_a_json_415(app, codings):
    """uvicorn undoes only the chunked framing: a plain body labelled gzip-coded was served."""
    response = call(app, "POST", "/v1/completions", CHAT, content_type="application/json",
                    transfer_encoding=codings)
    error = assert_error(response, 415)
    assert error["message"] == ("the request body must be sent uncompressed, with no Transfer-Encoding but chunked "
                                f"(this request's: {codings!r})")


def test_a_gzip_body_is_told_it_is_compressed_not_that_it_is_invalid_utf8(app):
    response = call(app, "POST", "/v1/completions", gzip.compress(CHAT), content_type="application/json",
                    content_encoding="gzip")
    assert "uncompressed" in assert_error(response, 415)["message"]


@pytest.mark.parametrize("encoding", ["identity", "IDENTITY", ""])
def test_an_identity_content_encoding_is_served(app, encoding):
    response = call(app, "POST", "/v1/chat/completions", CHAT, content_type="application/json",
                    content_encoding=encoding)
    assert response.status_code == 200, response.text


def test_a_chunked_transfer_coding_is_served(app):
    response = call(app, "POST", "/v1/chat/completions", CHAT, content_type="application/json",
                    transfer_encoding="chunked")
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("types", [("application/json", "text/plain"), ("text/plain", "application/json"),
                                   ("application/json", "application/json")])
def test_a_body_with_two_content_types_gets_a_json_400(app, types):
    """The first was taken: a JSON body that a proxy reading the last took for text was served."""
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/chat/completions", content=CHAT,
                                     headers=[("content-type", value) for value in types])

    error = assert_error(asyncio.run(scenario()), 400)
    assert error["message"] == "the request has 2 Content-Type headers; send one"
