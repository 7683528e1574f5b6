"""``POST /v1/responses``: a Responses API request answered through the chat completion path.

The request's chat body (`helios.server.responses_api.chat_request`) runs through
`ServedModel.respond` as a ``/v1/chat/completions`` request does; a chat-path error raised before the
answer starts names the Responses fields (`renamed_error`). A streamed answer is the chat stream
presented as Responses events (`helios.server.responses_stream.ResponsesStream`); a JSON answer is the
chat response, written to this function rather than to the client (its lease ends with that write),
presented as a Response object, or, for an error, the chat error body with the Responses field as its
``param``.
"""

from __future__ import annotations

import json

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope

from helios.errors import HeliosError
from helios.server.request_metrics import RequestRecord
from helios.server.responses_api import chat_request, renamed_error, response_object, responses_param
from helios.server.responses_schema import ResponsesRequest
from helios.server.responses_stream import ResponsesStream, chat_scope
from helios.server.schemas import check_model
from helios.server.service import ServedModel


async def respond(served: ServedModel, body: ResponsesRequest, scope: Scope, receive: Receive,
                  record: RequestRecord | None) -> Response:
    """Answers one ``POST /v1/responses`` (see the module docstring); `record` is the access log's."""
    check_model(body.model, served.card.served_names)
    chat, paths = chat_request(body)
    try:
        answer = await served.respond(chat, receive, record)
    except HeliosError as error:
        raise renamed_error(error, paths) from None
    if body.stream:
        return ResponsesStream(answer, body, paths)
    messages = []

    async def capture(message) -> None:
        messages.append(message)

    await answer(chat_scope(scope), receive, capture)
    status = next(message["status"] for message in messages if message["type"] == "http.response.start")
    parsed = json.loads(b"".join(message.get("body", b"") for message in messages[1:]))
    if status != 200:  # an error the engine ended the request with (its message names no chat field)
        error = parsed.get("error")
        if isinstance(error, dict):
            error["param"] = responses_param(error.get("param"), paths)
        return JSONResponse(parsed, status_code=status)
    return JSONResponse(response_object(body, parsed), status_code=200)
