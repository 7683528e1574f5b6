"""ASGI middleware for operators: the API key and the access log.

`ApiKeyGuard`: with a key set (``--api-key`` or ``HELIOS_API_KEY``), every ``/v1/`` request must
carry ``Authorization: Bearer KEY`` (compared in constant time); others get 401 with an
OpenAI-style error body before their body is read. ``/health``, ``/metrics`` and
``/openapi.json`` stay open for probes and scrapers.

`AccessLog`: one line per HTTP request on the ``helios.access`` logger, written when the response
ended (a stream: after its last chunk): client, method, path, status, prompt and completion tokens,
finish reason, latency and time to first token (milliseconds), and the request's ``user``. The
`RequestRecord` it puts in the scope's state (``helios_record``) is filled by the completion path
(`helios.server.request_metrics`); other routes log no tokens.
"""

from __future__ import annotations

import hmac
import json
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from helios.server.request_metrics import RequestRecord

API_KEY_ENV = "HELIOS_API_KEY"
RECORD_KEY = "helios_record"
access_logger = logging.getLogger("helios.access")


class ApiKeyGuard:
    """401 for ``/v1/`` requests without the bearer key (see the module docstring)."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._expected = f"Bearer {api_key}".encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/") or self._is_authorized(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": {"message": "a valid API key is required: send 'Authorization: Bearer KEY'",
                                     "type": "authentication_error", "param": None, "code": 401}}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})

    def _is_authorized(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        return hmac.compare_digest(given, self._expected)


class AccessLog:
    """One line per request on ``helios.access`` (see the module docstring)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord.now()
        scope.setdefault("state", {})[RECORD_KEY] = record
        status = [500]

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            if access_logger.isEnabledFor(logging.INFO):
                access_logger.info("%s", access_line(scope, status[0], record))


def access_line(scope: Scope, status: int, record: RequestRecord) -> str:
    client = scope.get("client")
    where = f"{client[0]}:{client[1]}" if client else "-"
    latency_ms = (time.monotonic() - record.arrival_s) * 1000.0
    fields = [where, f'"{scope.get("method", "")} {scope.get("path", "")}"', str(status)]
    totals = record.totals()
    if totals is not None:
        fields.append(f"prompt_tokens={totals[0]} completion_tokens={totals[1]} finish={record.finish_reason}")
        if record.choices:
            fields.append(f"choices={1 + len(record.choices)}")
    if record.first_token_s is not None:
        fields.append(f"ttft_ms={(record.first_token_s - record.arrival_s) * 1000.0:.1f}")
    fields.append(f"latency_ms={latency_ms:.1f}")
    if record.model_name:
        fields.append(f"model={record.model_name}")
    if record.user is not None:
        fields.append(f"user={json.dumps(record.user)}")
    return " ".join(fields)
