"""The first check of every request body, before FastAPI decodes it: size, encoding, JSON shape.

`BodyGuard` is an ASGI middleware in front of the routes that take a JSON body (POST). It answers
itself, with an OpenAI-style error body, when the body

- is larger than `max_body_nbytes` (from ``Content-Length`` at once, or while reading a chunked
  body, never holding more than the limit): 413 `BodyTooLarge`, naming ``--max-body-bytes`` (a
  client's images count in the body as base64, and only the operator can make room for more);
- is not empty and was sent with several Content-Type headers (a singleton field: readers that take
  different ones disagree on what the body is, RFC 9110 8.3; the first was taken): 400 `MalformedBody`;
- is not empty and was sent with a Content-Type other than JSON (``application/json``,
  ``application/*+json``), or none: 415 `UnsupportedMediaType` (after reading it: a body left unread
  would reset the connection before the answer is read);
- is sent with a ``Content-Encoding`` other than ``identity`` (gzip, br, ...), or a
  ``Transfer-Encoding`` other than ``chunked`` (``gzip, chunked``: uvicorn undoes only the chunked
  framing), which the server does not decode: 415 `UnsupportedContentEncoding`, with
  ``Accept-Encoding: identity`` (read, then answered, as above; a compressed body was refused as
  invalid UTF-8 or JSON, and a plain one labelled compressed was served);
- is sent with a JSON Content-Type whose ``charset`` parameter names another encoding than UTF-8
  (``latin-1``, ``utf-16``) and holds a byte past ASCII: 415 `UnsupportedCharset` naming it (JSON
  over HTTP is UTF-8, RFC 8259 8.1; read as UTF-8 regardless, a latin-1 body whose bytes happen to
  be valid UTF-8 was silently read as other text: ``Ã©`` as ``é``). An ASCII body reads the same
  under ``us-ascii`` or ``ISO-8859-1`` (Java clients' default label) and is served;
- is not strict UTF-8 (invalid bytes, UTF-8-encoded surrogates) or starts with a byte-order mark:
  400 `MalformedBody`;
- is not strict JSON: ``NaN``/``Infinity`` literals, numbers beyond the float range (``1e999``,
  which Python reads as infinity), a key twice in one object (readers disagree on which one holds:
  ``"max_tokens"`` or ``"model"`` given twice could read one way in a proxy and another here),
  integers beyond 4,300 digits, nesting deeper than
  `MAX_JSON_DEPTH`, or any string (key or value) holding a lone surrogate escape such as
  ``"\\ud800"``, which is valid JSON but no Unicode text: 400 `MalformedBody`;
- has not arrived whole within the body timeout (the server's, from the scope's `BODY_TIMEOUT_KEY`,
  which `helios.server.connection_limits` sets; else `body_timeout_s`), counted from the first
  read: 408 `RequestTimeout`, and the connection is closed.

So no string that cannot be encoded as UTF-8 ever reaches validation, preparation or the model
worker. A body of `OFF_LOOP_NBYTES` or more is read and checked off the event loop (`run_off_loop`:
a 4 MiB body of a million items takes seconds, which would stall every other connection). A body
that passes is replayed unchanged to the application, and the value read from it is left in the
scope (`PARSED_BODY_KEY`, a `ParsedBody`) so that the route need not read it again; later `receive`
calls go to the connection (disconnect detection keeps working). With `json_paths`, only a POST to
one of those paths is judged as JSON (media type, encoding, shape); a POST to any other path is
still read whole within the size and time limits (a body left unread would reset the connection),
then left to the router, whose 404 or 405 is the answer (a body was not the client's mistake there:
the path was).
"""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any, Callable, Collection, NamedTuple, TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from helios.errors import RequestError
from helios.frontend.preparation.strict_json import NotStrictJSON, strict_loads
from helios.server.defaults import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_NBYTES
from helios.server.echo import clipped
from helios.server.responses import error_response

BODY_TIMEOUT_KEY = "helios.body_timeout_s"  # scope key: the server's body timeout for this request
PARSED_BODY_KEY = "helios.parsed_body"  # scope key: the `ParsedBody` of a JSON body that passed
OFF_LOOP_NBYTES = 64 * 1024  # a JSON body this large or larger is checked (and validated) in a thread
MAX_JSON_DEPTH = 64
BOM = b"\xef\xbb\xbf"
T = TypeVar("T")


class ParsedBody(NamedTuple):
    """A request body that passed `check_json_text`: the value read from it and its size."""

    value: Any
    nbytes: int

    @property
    def is_large(self) -> bool:
        """Whether work over the whole body belongs off the event loop (`OFF_LOOP_NBYTES`)."""
        return self.nbytes >= OFF_LOOP_NBYTES


class BodyTooLarge(RequestError):
    """The request body is larger than the server's limit (``--max-body-bytes``)."""

    http_status = 413

    def __init__(self, nbytes: int | None, limit: int):
        """`nbytes`: the body's declared size (None: a chunked body, past `limit` while read)."""
        size = (f"is {nbytes} bytes; this server accepts at most {limit}" if nbytes is not None
                else f"is larger than this server's limit of {limit} bytes")
        super().__init__(f"the request body {size} (the operator sets the limit: helios serve --max-body-bytes; "
                         "images count in it as base64, 4 characters for every 3 bytes)")


class MalformedBody(RequestError):
    """The request body is not strict UTF-8 JSON text."""


class RequestTimeout(RequestError):
    """The request (its head, or its body) did not arrive within the server's deadline."""

    http_status = 408


def check_json_text(body: bytes) -> Any:
    """The parsed body, or `MalformedBody` saying why it is not strict UTF-8 JSON."""
    if body.startswith(BOM):
        raise MalformedBody("the request body starts with a UTF-8 byte-order mark; send plain UTF-8 JSON")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise MalformedBody(f"the request body is not valid UTF-8 (byte {error.start})") from None
    try:
        value = strict_loads(text)
    except RecursionError:
        raise MalformedBody(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except NotStrictJSON as error:
        raise MalformedBody(f"the request body is not strict JSON: {error}") from None
    except ValueError as error:  # JSONDecodeError, oversized integers
        raise MalformedBody(f"the request body is not valid JSON: {error}") from None
    _check_values(value)
    return value


_CHECKED = (str, list, dict)


def _check_values(value: Any) -> None:
    """Depth bound and no lone surrogates, iteratively (no recursion on hostile nesting)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                raise MalformedBody(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_text(key)
                    stack.append((child, depth + 1))
            else:  # numbers (a token-id prompt) need no check: only texts and containers are pushed
                stack.extend([(child, depth + 1) for child in item if isinstance(child, _CHECKED)])


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise MalformedBody(
            f"the request body holds a lone surrogate (\\u{ord(text[error.start]):04x}), which is not "
            "Unicode text") from None


class UnsupportedMediaType(RequestError):
    """A body sent without a JSON Content-Type (``application/json`` or ``application/*+json``): the
    endpoints read no other (FastAPI's strict content type: not even a body with none). HTTP 415."""

    http_status = 415

    def __init__(self, content_type: str | None):
        sent = f"this request's: {clipped(content_type)!r}" if content_type else "this request has none"
        super().__init__(f"the request body must be JSON sent with Content-Type: application/json ({sent})")


def is_json_media_type(content_type: str | None) -> bool:
    """Whether a Content-Type makes a request's body JSON for the endpoints: ``application/json`` or
    ``application/<anything>+json``, with any parameters."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class UnsupportedCharset(RequestError):
    """A JSON body labelled with a ``charset`` other than UTF-8: JSON over HTTP is UTF-8 (RFC 8259
    8.1), and the server reads no other. HTTP 415."""

    http_status = 415

    def __init__(self, charset: str):
        super().__init__(f"the request body must be UTF-8 JSON (this request's Content-Type names charset "
                         f"{clipped(charset)!r}); send it as UTF-8, with charset=utf-8 or no charset")


def non_utf8_charset(content_type: str | None) -> str | None:
    """The first ``charset`` parameter of a Content-Type that names another encoding than UTF-8
    (``UTF-8``, ``utf8``, quoted or not, are UTF-8), or None where there is none such."""
    for parameter in (content_type or "").split(";")[1:]:
        name, _, value = parameter.partition("=")
        value = value.strip().strip('"').strip()
        if name.strip().lower() == "charset" and value.lower().replace("-", "").replace("_", "") != "utf8":
            return value
    return None


class UnsupportedContentEncoding(RequestError):
    """A body sent in a coding the server does not decode: a ``Content-Encoding`` other than
    ``identity``, a ``Transfer-Encoding`` other than ``chunked`` (HTTP 415, answered with
    ``Accept-Encoding: identity``)."""

    http_status = 415

    def __init__(self, header: str, codings: str):
        allowed = "no Content-Encoding" if header == "Content-Encoding" else "no Transfer-Encoding but chunked"
        super().__init__(f"the request body must be sent uncompressed, with {allowed} (this request's: "
                         f"{clipped(codings)!r})")


# The codings of each header that the server undoes (uvicorn, the chunked framing) or that change nothing.
_DECODED_CODINGS = {b"content-encoding": ("", "identity"), b"transfer-encoding": ("", "identity", "chunked")}


def check_body_codings(scope: Scope) -> None:
    """`UnsupportedContentEncoding` where a coding header (several of one name read as one list)
    names a coding the server does not decode."""
    for header, decoded in _DECODED_CODINGS.items():
        codings = ", ".join(value.decode("latin-1") for name, value in scope.get("headers", ()) if name == header)
        if any(coding.strip().lower() not in decoded for coding in codings.split(",")):
            raise UnsupportedContentEncoding(header.decode().title(), codings)


def content_type_of(scope: Scope) -> str | None:
    """The request's Content-Type (None: it has none); `MalformedBody` where it has several."""
    values = [value.decode("latin-1") for name, value in scope.get("headers", ()) if name == b"content-type"]
    if len(values) > 1:
        raise MalformedBody(f"the request has {len(values)} Content-Type headers; send one")
    return values[0] if values else None


class BodyGuard:
    """See the module docstring. Requests other than POST pass through untouched; `json_paths`
    (None: every path) are those whose POST body is judged as JSON."""

    def __init__(self, app: ASGIApp, max_body_nbytes: int = DEFAULT_MAX_BODY_NBYTES,
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S, json_paths: Collection[str] | None = None):
        self.app = app
        self.max_body_nbytes = max_body_nbytes
        self.body_timeout_s = body_timeout_s
        self.json_paths = None if json_paths is None else frozenset(json_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read_in_time(scope, receive)
            if body is None:
                return  # the client went away while sending
            if body and (self.json_paths is None or scope["path"] in self.json_paths):
                content_type = content_type_of(scope)
                if not is_json_media_type(content_type):
                    raise UnsupportedMediaType(content_type)  # read first: a body left unread resets the connection
                if (charset := non_utf8_charset(content_type)) is not None and not body.isascii():
                    raise UnsupportedCharset(charset)  # ASCII bytes read alike in every charset clients send
                check_body_codings(scope)
                scope[PARSED_BODY_KEY] = await _parsed(body)
        except RequestError as error:
            response = error_response(error)
            if isinstance(error, RequestTimeout):
                response.headers["connection"] = "close"  # the rest of the body may still be on its way
            elif isinstance(error, UnsupportedContentEncoding):
                response.headers["accept-encoding"] = "identity"  # RFC 9110 15.5.16: the codings accepted
            await response(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_in_time(self, scope: Scope, receive: Receive) -> bytes | None:
        timeout_s = scope.get(BODY_TIMEOUT_KEY, self.body_timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                return await self._read(scope, receive)
        except TimeoutError:
            raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        limit = self.max_body_nbytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise BodyTooLarge(int(value), limit)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(None, limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _parsed(body: bytes) -> ParsedBody:
    """`check_json_text` of `body`, in a thread where the body is large."""
    if len(body) < OFF_LOOP_NBYTES:
        return ParsedBody(check_json_text(body), len(body))
    return ParsedBody(await run_off_loop(check_json_text, body), len(body))


class _CyclicGCPause:
    """Pauses Python's cyclic garbage collector while any holder is inside (a context manager safe
    across threads), and resumes it after the last one where it was on before the first. A large
    body read as JSON makes up to a million containers; each few hundred thousand would start a
    full collection of the server's whole heap (hundreds of ms each), which holds the interpreter
    lock, so the event loop would wait for it even with the reading in a thread. Cycles made
    meanwhile are collected by the first collection after the pause."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._num_holders = 0
        self._was_enabled = False

    def __enter__(self) -> None:
        with self._lock:
            if self._num_holders == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._num_holders += 1

    def __exit__(self, *_exc) -> None:
        with self._lock:
            self._num_holders -= 1
            if self._num_holders == 0 and self._was_enabled:
                gc.enable()


_GC_PAUSE = _CyclicGCPause()


async def run_off_loop(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` in a thread, with the cyclic garbage collector paused meanwhile (see
    `_CyclicGCPause`): for work over a large body (reading, checking, validating it)."""

    def paused() -> T:
        with _GC_PAUSE:
            return work(*args)

    return await asyncio.to_thread(paused)


def _replay(body: bytes, receive: Receive) -> Receive:
    is_sent = False

    async def replayed() -> Message:
        nonlocal is_sent
        if not is_sent:
            is_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
