"""``POST /v1/responses``: a Responses API request answered through the chat completion path.

The request's chat body (`helios.server.responses_api.chat_request`, streamed either way) runs through
`ServedModel.respond` as a ``/v1/chat/completions`` request does; a chat-path error raised before the
answer starts names the Responses fields (`renamed_error`). A streamed answer is the chat stream
presented as Responses events (`helios.server.responses_stream.ResponsesStream`); a JSON answer is the
same stream, written to this function rather than to the client (its lease ends with that write),
folded into the Response object its terminal event carries (`folded_response`), or, for an error that
ended it, the chat error body with the Responses field as its ``param``.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import Receive, Scope

from helios.errors import HeliosError
from helios.server.request_metrics import RequestRecord
from helios.server.responses_api import chat_request, renamed_error
from helios.server.responses_schema import ResponsesRequest
from helios.server.responses_stream import ResponsesStream, folded_response
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
    return await folded_response(answer, body, paths, scope, receive)
