"""The OpenAI-compatible HTTP application of one served model.

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (JSON, or SSE with
``stream: true``), ``GET /v1/models`` (and ``/v1/models/{id}``), ``GET /health`` (503 once the
model worker died, or while its engine process sends no heartbeat: stopped or hung, or while its
worker completes no step with requests pending: stalled), ``GET /metrics`` (Prometheus text) and
``GET /openapi.json``; OpenAI's ``POST /v1/responses``, stateless, answered through the chat path
(`helios.server.responses_route`); and vLLM's ``POST /tokenize``, ``POST /detokenize`` and
``GET /version`` (`helios.server.tokenize`). Request bodies are the strict models of
`helios.server.schemas`, so the OpenAPI document describes exactly what the server accepts: unknown
or unsupported fields are rejected, not ignored.

Errors are OpenAI-style bodies (``{"error": {"message", "type", "param", "code"}}``) whose status
comes from the error's class: a missing API key 401 (when the server has one), schema violations
and malformed JSON 400 (never 422; each violation named by its place in the body, ``prompt[0]``,
without pydantic's union-member tags), `HeliosError`
subclasses their ``http_status`` (400 invalid request, 404 a model not served here, 429 ingress
full, 503 admission rejection, 500 execution failure), anything unexpected 500; ``param`` names the
request field at fault where the error knows it. The lifespan starts the model worker and, at
shutdown (after uvicorn drained or dropped the connections), stops it once its round is done.

A route's body is the value `BodyGuard` read from it (`ParsedBodyRoute`: never read twice), validated
in a thread when the body is large, so no one request's validation holds the event loop for long.
"""

from __future__ import annotations

import asyncio
import json
import re
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from helios.errors import ExecutionError, HeliosError, RequestError
from helios.server.access import RECORD_KEY, AccessLog, ApiKeyGuard
from helios.server.body_guard import (
    DEFAULT_MAX_BODY_NBYTES, PARSED_BODY_KEY, BodyGuard, ParsedBody, UnsupportedMediaType, is_json_media_type,
    run_off_loop,
)
from helios.server.echo import MAX_ECHO_CHARS, clipped, clipped_runs
from helios.server.metrics import ResponseCounter
from helios.frontend.responses.presentation import error_body
from helios.server.responses import ClientGoneGuard, error_response
from helios.server.schemas import ChatCompletionRequest, CompletionRequest, check_model
from helios.server.responses_route import respond as respond_responses
from helios.server.responses_schema import ResponsesRequest
from helios.server.schemas_tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from helios.server.service import ServedModel
from helios.server.tokenize import respond_detokenize, respond_tokenize, version

UNSUPPORTED_FIELD = "not a field this server accepts (unsupported options are rejected, not ignored)"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
# FastAPI's native OpenTelemetry off: the server has its own metrics and access log, and otherwise
# every request reads the environment for configured providers (`NativeTelemetry.enabled`).
NO_TELEMETRY = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}
# the routes that take a (JSON) body
JSON_BODY_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize", "/detokenize")
ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/models": "models",
    "/v1/models/": "models",  # a prefix (its key ends in "/"): /v1/models/{id}
    "/health": "health",
    "/metrics": "metrics",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/version": "version",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


class SchemaViolation(RequestError):
    """A request body that does not match the endpoint's schema (or is not JSON)."""


_ERRORS = {
    400: {"model": ErrorResponse, "description": "Invalid request (schema, strict UTF-8 JSON, limits)"},
    401: {"model": ErrorResponse, "description": "The server has an API key and the request lacks it"},
    404: {"model": ErrorResponse, "description": "The request names a model this server does not serve"},
    413: {"model": ErrorResponse, "description": "Request body larger than the server's limit"},
    415: {"model": ErrorResponse,
          "description": "Request body sent with a Content-Type other than JSON, or a charset other than UTF-8"},
    429: {"model": ErrorResponse, "description": "Admission limit reached; retry later"},
    500: {"model": ErrorResponse, "description": "Model execution failure"},
    503: {"model": ErrorResponse, "description": "Scheduler admission rejected the request (non-streamed)"},
}
_COMPLETION_RESPONSES = {
    200: {
        "description": "A completion (JSON), or with stream=true an SSE stream of chunks ending in "
        "`data: [DONE]`, or in one `event: error` when the request fails after the headers",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    **_ERRORS,
}


def create_app(served: ServedModel, max_body_nbytes: int = DEFAULT_MAX_BODY_NBYTES,
               api_key: str | None = None) -> FastAPI:
    """The application; its lifespan starts and stops `served`'s model worker. Bodies larger than
    `max_body_nbytes` get 413 before they are read whole (`helios.server.body_guard`); with
    `api_key`, ``/v1/`` requests without it get 401 (`helios.server.access`, also the access log)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        served.start()
        try:
            yield
        finally:
            await asyncio.to_thread(served.shutdown)

    # No trailing-slash redirects: Starlette's 307 builds its Location from the request's Host
    # header (a client-chosen host) and answers with an empty body; such a path gets a JSON 404.
    app = FastAPI(title="Helios", summary="OpenAI-compatible serving of a prepared model core",
                  version="1", lifespan=lifespan, docs_url=None, redoc_url=None, telemetry=NO_TELEMETRY,
                  redirect_slashes=False)
    _install_error_handlers(app)
    app.router.route_class = ParsedBodyRoute
    _install_routes(app, served)
    _document_400_not_422(app)
    _openapi_get_only(app)
    app.add_middleware(BodyGuard, max_body_nbytes=max_body_nbytes, json_paths=JSON_BODY_PATHS)
    if api_key:
        app.add_middleware(ApiKeyGuard, api_key=api_key)
    app.add_middleware(ResponseCounter, counter=served.metrics.http_responses, endpoints=ENDPOINTS)
    app.add_middleware(ClientGoneGuard)  # inside the access log: a client gone mid-write is its 499
    app.add_middleware(AccessLog)
    return app


class ParsedBodyRoute(APIRoute):
    """A route whose JSON body is the value `BodyGuard` read (its scope's `ParsedBody`) rather than
    the body read again, and, where that body is large, validated against the route's model off the
    event loop (`run_off_loop`): FastAPI then takes the validated model as it is. The errors are
    FastAPI's own (its validation of the same value), raised as the `RequestValidationError` it
    would raise."""

    def get_route_handler(self):
        handle = super().get_route_handler()

        async def handler(request: Request) -> Response:
            parsed: ParsedBody | None = request.scope.get(PARSED_BODY_KEY)
            if parsed is None or self.body_field is None:
                return await handle(request)
            value = parsed.value
            if parsed.is_large:
                value, errors = await run_off_loop(partial(self.body_field.validate, value, loc=("body",)))
                if errors:
                    raise RequestValidationError(errors, body=parsed.value)
            return await handle(_ParsedRequest(request.scope, request.receive, value))

        return handler


class _ParsedRequest(Request):
    """A request whose JSON body is already read (`ParsedBodyRoute`)."""

    def __init__(self, scope, receive, value) -> None:
        super().__init__(scope, receive)
        self._parsed_value = value

    async def json(self):
        return self._parsed_value


def _install_routes(app: FastAPI, served: ServedModel) -> None:
    @app.post("/v1/chat/completions", responses=_COMPLETION_RESPONSES, response_class=Response)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """Chat completion (OpenAI), with tools, reasoning, structured output, stops and observation."""
        check_model(body.model, served.card.served_names)
        return await served.respond(body, request.receive, getattr(request.state, RECORD_KEY, None))

    @app.post("/v1/completions", responses=_COMPLETION_RESPONSES, response_class=Response)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """Text completion (OpenAI) of a text or token-id prompt."""
        check_model(body.model, served.card.served_names)
        return await served.respond(body, request.receive, getattr(request.state, RECORD_KEY, None))

    @app.post("/v1/responses", responses={200: {
        "description": "A Response object (JSON), or with stream=true an SSE stream of typed events ending in "
        "`response.completed` or `response.incomplete`, or in one `error` event when the request fails after the "
        "headers", "content": {"application/json": {}, "text/event-stream": {}}}, **_ERRORS}, response_class=Response)
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        """Responses (OpenAI), stateless, answered through the chat path (`helios.server.responses_route`)."""
        return await respond_responses(served, body, request.scope, request.receive,
                                       getattr(request.state, RECORD_KEY, None))

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [_model_entry(served, name) for name in served.card.served_names]}

    @app.get("/v1/models/{model_id:path}", responses={404: {"model": ErrorResponse}})
    async def get_model(model_id: str) -> dict:
        check_model(model_id, served.card.served_names)
        return _model_entry(served, model_id)

    @app.get("/health", responses={503: {"description": "The model worker died, or its engine process is "
                                                        "unresponsive (stopped or hung) or stalled (a step stuck "
                                                        "with requests pending); `reason` says which"}})
    async def health() -> JSONResponse:
        if not served.is_healthy:
            return JSONResponse({"status": "unhealthy"}, status_code=503)
        problem = served.liveness_problem()
        if problem is None:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": problem[0], "reason": problem[1]}, status_code=503)

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(served.metrics.render(), media_type=PROMETHEUS_TEXT)

    @app.post("/tokenize", responses={200: {"model": TokenizeResponse}, **_ERRORS}, response_class=Response)
    async def tokenize(body: TokenizeRequest) -> Response:
        """Extension (vLLM): a text's or a chat's prompt token ids (`helios.server.tokenize`)."""
        return await respond_tokenize(served, body)

    @app.post("/detokenize", responses={200: {"model": DetokenizeResponse}, **_ERRORS}, response_class=Response)
    async def detokenize(body: DetokenizeRequest) -> Response:
        """Extension (vLLM): the text of token ids."""
        return await respond_detokenize(served, body)

    @app.get("/version")
    async def get_version() -> dict:
        return version()


def _openapi_get_only(app: FastAPI) -> None:
    """Starlette adds HEAD to the route FastAPI serves ``/openapi.json`` on (a plain route with GET);
    every other GET route answers HEAD with 405, so this one does too."""
    for route in app.router.routes:
        if getattr(route, "path", None) == app.openapi_url and getattr(route, "methods", None):
            route.methods = {"GET"}


def _document_400_not_422(app: FastAPI) -> None:
    """FastAPI documents its own 422 for body validation; this server answers those with 400."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            document = generate()
            for operations in document.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = document.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            _json_schema_bounds(schemas)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi


# pydantic names the bounds of a validated integer (`helios.server.schemas.StrictInt`, which takes
# 4.0 as 4) by their Python names; the document uses JSON Schema's keywords.
_BOUND_KEYWORDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _json_schema_bounds(node) -> None:
    if isinstance(node, list):
        for item in node:
            _json_schema_bounds(item)
    elif isinstance(node, dict):
        if node.get("type") in ("integer", "number"):
            for name, keyword in _BOUND_KEYWORDS.items():
                if name in node and keyword not in node:
                    node[keyword] = node.pop(name)
        for key, value in node.items():
            if key != "properties" or isinstance(value, dict):
                _json_schema_bounds(value)


def _model_entry(served: ServedModel, name: str) -> dict:
    card = served.card
    return {"id": name, "object": "model", "created": card.created, "owned_by": card.owned_by,
            "max_model_len": card.context_tokens}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        content_type = request.headers.get("content-type")
        if not is_json_media_type(content_type):  # an empty body (BodyGuard answers a non-empty one)
            return error_response(UnsupportedMediaType(content_type))
        violation = schema_violation(error.errors(), error.body)
        return JSONResponse(error_body(violation), status_code=violation.http_status)

    @app.exception_handler(HeliosError)
    async def typed_error(_request: Request, error: HeliosError) -> JSONResponse:
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        message = str(error.detail)
        if error.status_code == 404:
            message = _not_found_message(app, request.scope)
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                          "code": error.status_code}}
        return JSONResponse(body, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, error: Exception) -> JSONResponse:
        return error_response(ExecutionError(f"internal error: {type(error).__name__}"))


def _not_found_message(app: FastAPI, scope) -> str:
    """The router's 404: "Not Found", naming the route where the path is one with trailing slashes
    (from the scope's path, never from the Host header)."""
    path = scope.get("path", "")
    route = path.rstrip("/")
    if route == path or not any(getattr(known, "path", None) == route for known in app.router.routes):
        return "Not Found"
    method = scope.get("method", "")
    return (f"Not Found: {method} {clipped(path)} (this server's paths take no trailing slash: "
            f"{method} {route})")


def schema_violation(errors, body=None) -> SchemaViolation:
    """The 400 error of pydantic/JSON validation errors: the first few, with their locations in
    `body` (the parsed request body; see `_location`)."""
    errors = list(errors)
    if errors and errors[0].get("type") == "missing" and tuple(errors[0].get("loc", ())) == ("body",):
        return SchemaViolation("the request body is empty: send a JSON object of the endpoint's fields", None)
    if errors and errors[0].get("type") == "json_invalid":
        detail = errors[0].get("ctx", {}).get("error", "")
        return SchemaViolation(f"the request body is not valid JSON: {detail}".rstrip(": "), None)
    described: dict[str, None] = {}  # distinct descriptions in order (union members repeat)
    for consumed, entry in enumerate(errors[:DESCRIBED_ERRORS_SCANNED], 1):
        described[_describe(entry, body)] = None
        if len(described) == DESCRIBED_ERRORS:
            break
    else:
        consumed = min(len(errors), DESCRIBED_ERRORS_SCANNED)
    more = f" (and {len(errors) - consumed} more)" if len(errors) > consumed else ""
    param = _location(errors[0], body) if errors else ""
    return SchemaViolation("invalid request body: " + "; ".join(described) + more, param or None)


# A schema violation's message describes its first DESCRIBED_ERRORS distinct errors, looking at no
# more than DESCRIBED_ERRORS_SCANNED of pydantic's (a 4 MiB body can hold a million invalid values;
# describing each would hold the event loop for seconds).
DESCRIBED_ERRORS = 4
DESCRIBED_ERRORS_SCANNED = 64


# The fields whose value picks the member of a discriminated union (`schemas.Message`, `UserPart`,
# `ResponseFormat`): pydantic puts that value in an error's location after the union's own.
_DISCRIMINATORS = ("role", "type")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _location(entry: dict, body) -> str:
    """An error's place in the body as a client writes it (``messages[0].content``, ``prompt[0]``).
    pydantic's ``loc`` also names the member of a union it tried (``str``, ``list[...]`` with
    validator reprs, a discriminator value such as ``user``), which is no part of the body: only
    the parts that are a key or an index of `body` are kept (and a missing field's name). Without a
    body, parts that cannot be a field name are left out."""
    parts = tuple(entry.get("loc", ()))
    if parts[:1] == ("body",):
        parts = parts[1:]
    if not isinstance(body, (dict, list)):
        return _render(part for part in parts if isinstance(part, int) or _NAME.fullmatch(part))
    kept, node, has_tag = [], body, False
    for index, part in enumerate(parts):
        after = parts[index + 1] if index + 1 < len(parts) else None
        if isinstance(node, list) and _has(node, part):
            kept.append(part)
            node, has_tag = node[part], False
        elif isinstance(node, dict) and _has(node, part) and (has_tag or not _is_discriminator(node, part)
                                                              or not _has(node, after) or _has(node[part], after)):
            # A key equal to the node's discriminator value (``{"type": "json_schema", "json_schema": ...}``)
            # is pydantic's member tag when the part after it belongs to the node itself.
            kept.append(part)
            node, has_tag = node[part], False
        elif isinstance(node, dict) and not has_tag and _is_discriminator(node, part):
            has_tag = True  # the union member this node was validated as
        elif after is None and entry.get("type") == "missing" and isinstance(part, str):
            kept.append(part)
    return _render(kept)


def _has(node, part) -> bool:
    if isinstance(node, list):
        return type(part) is int and 0 <= part < len(node)
    return isinstance(node, dict) and isinstance(part, str) and part in node


def _is_discriminator(node: dict, part) -> bool:
    return any(node.get(name) == part for name in _DISCRIMINATORS)


def _render(parts) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _NAME.fullmatch(part) and len(part) <= MAX_ECHO_CHARS:
            text += f".{part}" if text else part
        else:
            text += f"[{json.dumps(clipped(part))}]"  # a client's key: quoted, bounded
    return text


# pydantic's messages for numeric bounds print the bound as a float (2**63: "less than
# 9223372036854776000"); an integer bound is written from its exact value instead.
_BOUNDS = {"less_than": ("lt", "less than"), "less_than_equal": ("le", "less than or equal to"),
           "greater_than": ("gt", "greater than"), "greater_than_equal": ("ge", "greater than or equal to")}


def _describe(entry: dict, body) -> str:
    message = UNSUPPORTED_FIELD if entry.get("type") == "extra_forbidden" else str(entry.get("msg", "invalid"))
    key, words = _BOUNDS.get(entry.get("type"), (None, ""))
    bound = entry.get("ctx", {}).get(key)
    if type(bound) is int:
        message = f"Input should be {words} {bound}"
    message = clipped(clipped_runs(message), 2 * MAX_ECHO_CHARS)  # pydantic may quote the value (a tag)
    where = _location(entry, body)
    return f"{where}: {message}" if where else message
