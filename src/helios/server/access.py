"""ASGI middleware for operators: the API key and the access log.

`ApiKeyGuard`: with a key set (``--api-key`` or ``HELIOS_API_KEY``), every ``/v1/`` request (and
``/tokenize`` and ``/detokenize``, which render templates and tokenize on the server's CPU) must
carry ``Authorization: Bearer KEY`` (the scheme in any case, as HTTP's schemes are; the key compared
in constant time); others get 401 with an
OpenAI-style error body before their body is read. ``/health``, ``/metrics``, ``/version`` and
``/openapi.json`` stay open for probes and scrapers.

`AccessLog`: one line per HTTP request on the ``helios.access`` logger, written when the response
ended (a stream: after its last chunk): client, method, path, status, prompt and completion tokens,
finish reason (as the response gave it: ``stop`` for an end-of-sequence token, ``tool_calls`` for one
after tool calls), latency and time to
first token (milliseconds; the first output token of any choice),
the served model's name and the request's ``user`` (each quoted). The path is bounded
(`helios.server.echo`) and escaped like ``user`` and the model's name: quotes, controls and every other
character that is not printable (U+0085, U+2028 and U+2029, which line-splitting readers take for
line ends, and format characters such as U+202E) are escaped, so one request is one line. A
request whose client went away before its response started (it disconnected while sending its
body or while its answer was computed, or the response's first write found the connection closed)
is logged as 499, nginx's "client closed request"; 500 stays for a server error with no response
(the application raised, or returned without answering). The `RequestRecord` it puts in the scope's state
(``helios_record``) is filled by the completion path (`helios.server.request_metrics`); other
routes log no tokens. A stream ends as soon as its client is gone (or a send timeout or shutdown
drops it), before the engine confirms the cancel its close sent: its line has its status (200),
the prompt and the output tokens that had arrived, and ``finish=cancelled``
(`RequestRecord.logged_totals`); the line is never held back for the engine.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from helios.server.echo import clipped
from helios.server.request_metrics import RequestRecord

API_KEY_ENV = "HELIOS_API_KEY"
RECORD_KEY = "helios_record"
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request whose client went away before any response
access_logger = logging.getLogger("helios.access")
# What an address and port read as, written bare. uvicorn takes the client of a request from a trusted
# peer (127.0.0.1 by default) from its X-Forwarded-For header as written: other text (a space, a quote,
# U+0085 from a Latin-1 byte) is quoted and escaped, or it would forge fields or a line of its own.
_ADDRESS = re.compile(r"[0-9A-Za-z.:%_\[\]-]+")
# The finish reason a response showed its client where the engine's name differs, for a record the
# response bridge told no shown reason (`RequestRecord.show_finish`, which also tells ``tool_calls``;
# the record keeps the engine's, as `helios_requests_finished{reason}` counts them): an end-of-sequence
# token ends a response with "stop" (`helios.frontend.responses.presentation.finish_reason`). The other
# reasons are the same words, or ends the client saw as an error (its status or error event).
_CLIENT_REASONS = {"eos": "stop"}
# Guarded beside every ``/v1/`` path: the tokenizer endpoints spend preparation CPU (vLLM leaves
# them open).
_GUARDED_PATHS = ("/tokenize", "/detokenize")


class ApiKeyGuard:
    """401 for ``/v1/`` and tokenizer requests without the bearer key (see the module docstring)."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._expected = api_key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if not (path.startswith("/v1/") or path in _GUARDED_PATHS) or self._is_authorized(scope):
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
        scheme, _, key = given.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(key.lstrip(b" "), self._expected)


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
        status: int | None = None
        is_client_gone = has_raised = False

        async def recording_receive() -> Message:
            nonlocal is_client_gone
            message = await receive()
            if message["type"] == "http.disconnect":
                is_client_gone = True
            return message

        async def recording_send(message: Message) -> None:
            nonlocal status, is_client_gone
            if message["type"] != "http.response.start":
                await send(message)
                return
            try:
                await send(message)
            except BaseException:
                is_client_gone = True  # unless the application raises it on: then has_raised decides
                raise
            status = CLIENT_CLOSED_REQUEST if is_client_gone else message["status"]  # else it went nowhere

        try:
            await self.app(scope, recording_receive, recording_send)
        except BaseException:
            has_raised = True
            raise
        finally:
            if access_logger.isEnabledFor(logging.INFO):
                if status is None:
                    status = CLIENT_CLOSED_REQUEST if is_client_gone and not has_raised else 500
                access_logger.info("%s", access_line(scope, status, record))


def _escaped(text: str) -> str:
    """`text` as the inside of a JSON string, with every character that is not printable also
    escaped (``\\u2028``); printable non-ASCII text stays as it is."""
    quoted = json.dumps(text, ensure_ascii=False)[1:-1]
    if quoted.isprintable():
        return quoted
    return "".join(char if char.isprintable() else json.dumps(char)[1:-1] for char in quoted)


def access_line(scope: Scope, status: int, record: RequestRecord) -> str:
    client = scope.get("client")
    where = f"{client[0]}:{client[1]}" if client else "-"
    if not _ADDRESS.fullmatch(where):  # see `_ADDRESS`
        where = f'"{_escaped(where)}"'
    latency_ms = (time.monotonic() - record.arrival_s) * 1000.0
    path = _escaped(clipped(scope.get("path", "")))
    fields = [where, f'"{scope.get("method", "")} {path}"', str(status)]
    totals = record.logged_totals()
    if totals is not None:
        reason = _CLIENT_REASONS.get(totals[2], totals[2])
        fields.append(f"prompt_tokens={totals[0]} completion_tokens={totals[1]} finish={reason}")
        if record.choices:
            fields.append(f"choices={1 + len(record.choices)}")
    first_token_s = [r.first_token_s for r in (record, *record.choices) if r.first_token_s is not None]
    if first_token_s:  # the request's first output token, of any choice (as the TTFT histogram times it)
        fields.append(f"ttft_ms={(min(first_token_s) - record.arrival_s) * 1000.0:.1f}")
    fields.append(f"latency_ms={latency_ms:.1f}")
    if record.model_name:  # the operator's --served-model-name: quoted and escaped, or a space forges a field
        fields.append(f'model="{_escaped(record.model_name)}"')
    if record.user is not None:
        fields.append(f"user={json.dumps(record.user)}")
    return " ".join(fields)
