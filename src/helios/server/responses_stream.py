"""A streamed Responses API answer: the chat completion stream presented as the Responses API's events.

`ResponsesStream` runs the chat path's own streamed response (its lease, send deadline and
disconnect handling unchanged) with a send that hands each write to an `EventTranslator`, which turns
the chat chunks into typed events, each ``event: <type>`` and ``data: <json>`` with a
``sequence_number`` counting from 0:

- ``response.created`` and ``response.in_progress`` (the Response object, in progress, no output);
- per output item, in order: ``response.output_item.added``; a reasoning item's
  ``response.content_part.added`` (a ``reasoning_text`` part), ``response.reasoning_text.delta``
  events, ``response.reasoning_text.done`` and ``response.content_part.done``; a message's
  ``response.content_part.added`` (an ``output_text`` part), ``response.output_text.delta`` events
  (``logprobs``, when included: the entries delivered since the previous delta's, so those of
  reasoning or calls before the text go with its first delta; entries delivered after a message's
  last delta go with its done events' part, those after the last message ended with no event),
  ``response.output_text.done`` and ``response.content_part.done``; a function call's
  ``response.function_call_arguments.delta`` events and ``response.function_call_arguments.done``;
  then ``response.output_item.done`` with the whole item;
- ``response.completed`` (or ``response.incomplete``) with the whole Response, usage included: the
  JSON answer is this Response (`folded_response` runs the same chat stream through an
  `EventTranslator`), so the two forms agree item for item.

An error once the events are flowing (the chat stream's ``event: error``) is one ``error`` event
(``code``: the error's type, ``message``, ``param``), the last. The chat stream's ``[DONE]`` is not
passed on (the Responses API ends with its terminal event).
"""

from __future__ import annotations

import json

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from helios.frontend.responses.sse_encoding import encode_json
from helios.server.access import CLIENT_CLOSED_REQUEST
from helios.server.responses import TRANSPORT_SEND
from helios.server.responses_api import (
    function_call_item, message_item, new_id, outcome, output_logprobs, reasoning_item, response_shell, responses_param,
    text_part, usage_object,
)
from helios.server.responses_schema import LOGPROBS_INCLUDE, ResponsesRequest


def sse_event(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + encode_json(event).encode() + b"\n\n"


class EventTranslator:
    """The Responses events of one chat completion stream's bytes (see the module docstring)."""

    def __init__(self, body: ResponsesRequest, paths: dict[str, str]):
        self._body = body
        self._paths = paths
        self._includes_logprobs = LOGPROBS_INCLUDE in (body.include or ())
        self._buffer = b""
        self._sequence = 0
        self._response: dict | None = None  # the Response object, made at the first chunk
        self._items: list[dict] = []  # the output items done
        self._open: dict | None = None  # the item being streamed: its kind, id, index and text so far
        self._pending: list[dict] = []  # log-probability entries not yet sent with a text delta
        self._finish_reason: str | None = None
        self._usage: dict | None = None
        self.response: dict | None = None  # the final Response, once the terminal event is made
        self.error: dict | None = None  # the chat error body (its param the Responses field) that ended it

    def events(self, data: bytes) -> list[dict]:
        """The events (objects) of the chat stream's next bytes (complete SSE blocks; a partial one waits)."""
        self._buffer += data
        *blocks, self._buffer = self._buffer.split(b"\n\n")
        events: list[dict] = []
        for block in blocks:
            if block:
                events += self._block(block)
        return events

    def feed(self, data: bytes) -> bytes:
        """The events of the chat stream's next bytes, as SSE (`events`)."""
        return b"".join(sse_event(event) for event in self.events(data))

    def _block(self, block: bytes) -> list[dict]:
        name, data = None, b""
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[len(b"event: "):]
            elif line.startswith(b"data: "):
                data = line[len(b"data: "):]
        if name == b"error":
            return self._error(json.loads(data).get("error") or {})
        if data == b"[DONE]":
            return self._end()
        return self._chunk(json.loads(data))

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _snapshot(self) -> dict:
        return json.loads(encode_json(self._response))  # a copy: later events change the object

    def _chunk(self, chunk: dict) -> list[dict]:
        events: list[dict] = []
        if self._response is None:
            self._response = response_shell(self._body, new_id("resp"), chunk["created"], chunk["model"])
            events.append(self._event("response.created", response=self._snapshot()))
            events.append(self._event("response.in_progress", response=self._snapshot()))
        for choice in chunk.get("choices") or ():
            entries = output_logprobs(choice.get("logprobs"))
            if entries:
                self._pending += entries
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                events += self._reasoning(delta["reasoning_content"])
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or ():
                events += self._call(call)
            if choice.get("finish_reason") is not None:
                events += self._finish(choice["finish_reason"])
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        return events

    def _opened(self, kind: str, prefix: str, item: dict) -> list[dict]:
        """Closes the item being streamed (if any) and opens `item`, of `kind`."""
        events = self._close("completed")
        self._open = {"kind": kind, "id": new_id(prefix), "index": len(self._items), "text": ""}
        item["id"] = self._open["id"]
        events.append(self._event("response.output_item.added", output_index=self._open["index"], item=item))
        return events

    def _where(self, content_index: bool = True) -> dict:
        where = {"item_id": self._open["id"], "output_index": self._open["index"]}
        if content_index:
            where["content_index"] = 0
        return where

    def _reasoning(self, text: str) -> list[dict]:
        events = []
        if self._open is None or self._open["kind"] != "reasoning":
            item = {"id": "", "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            events += self._opened("reasoning", "rs", item)
            events.append(self._event("response.content_part.added", **self._where(),
                                      part={"type": "reasoning_text", "text": ""}))
        self._open["text"] += text
        events.append(self._event("response.reasoning_text.delta", **self._where(), delta=text))
        return events

    def _text(self, text: str) -> list[dict]:
        events = []
        if self._open is None or self._open["kind"] != "message":
            events += self._message_opened()
        self._open["text"] += text
        entries, self._pending = self._pending, []
        self._open["logprobs"] += entries
        events.append(self._event("response.output_text.delta", **self._where(), delta=text, logprobs=entries))
        return events

    def _call(self, call: dict) -> list[dict]:
        function = call.get("function") or {}
        if "id" in call:  # a call's first fragment: its id and name
            item = function_call_item("", "in_progress", call["id"], function.get("name", ""), "")
            events = self._opened("function_call", "fc", item)
            self._open.update(call_id=call["id"], name=function.get("name", ""))
        else:
            events = []
        fragment = function.get("arguments") or ""
        if fragment and self._open is not None and self._open["kind"] == "function_call":
            self._open["text"] += fragment
            events.append(self._event("response.function_call_arguments.delta", **self._where(False), delta=fragment))
        return events

    def _close(self, status: str) -> list[dict]:
        """Ends the item being streamed (if any): its done events, with `status`."""
        current = self._open
        if current is None:
            return []
        kind, text = current["kind"], current["text"]
        events = []
        if kind == "reasoning":
            item = reasoning_item(current["id"], text)
            events.append(self._event("response.reasoning_text.done", **self._where(), text=text))
            events.append(self._event("response.content_part.done", **self._where(), part=item["content"][0]))
        elif kind == "message":
            current["logprobs"] += self._pending
            self._pending = []
            logprobs = current["logprobs"] if self._includes_logprobs else None
            item = message_item(current["id"], status, text, logprobs)
            events.append(self._event("response.output_text.done", **self._where(), text=text,
                                      logprobs=logprobs or []))
            events.append(self._event("response.content_part.done", **self._where(), part=item["content"][0]))
        else:
            item = function_call_item(current["id"], "completed", current["call_id"], current["name"], text)
            events.append(self._event("response.function_call_arguments.done", **self._where(False), arguments=text))
        self._open = None
        events.append(self._event("response.output_item.done", output_index=current["index"], item=item))
        self._items.append(item)
        return events

    def _finish(self, finish_reason: str) -> list[dict]:
        """The chat output's end: the last item done (an empty message where the output made no
        message and no call, as the JSON answer has one)."""
        self._finish_reason = finish_reason
        status = outcome(finish_reason)[0]
        events = []
        if not any(item["type"] in ("message", "function_call") for item in self._items) and (
                self._open is None or self._open["kind"] == "reasoning"):
            events += self._message_opened()
        return events + self._close("incomplete" if status == "incomplete" else "completed")

    def _message_opened(self) -> list[dict]:
        item = {"id": "", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        events = self._opened("message", "msg", item)
        self._open["logprobs"] = []
        part = text_part("", [] if self._includes_logprobs else None)
        events.append(self._event("response.content_part.added", **self._where(), part=part))
        return events

    def _end(self) -> list[dict]:
        status, incomplete = outcome(self._finish_reason)
        self._response.update(status=status, incomplete_details=incomplete, output=self._items,
                              usage=usage_object(self._usage))
        kind = "response.completed" if status == "completed" else "response.incomplete"
        self.response = self._snapshot()
        return [self._event(kind, response=self._snapshot())]

    def _error(self, error: dict) -> list[dict]:
        param = error.get("param")
        param = responses_param(param, self._paths) if isinstance(param, str) else None
        self.error = {**error, "param": param}
        return [self._event("error", code=error.get("type"), message=error.get("message", ""), param=param)]


async def folded_response(chat: Response, body: ResponsesRequest, paths: dict[str, str], scope: Scope,
                          receive: Receive) -> Response:
    """The non-streamed answer: the chat path's streamed response `chat` run to its end (its lease,
    and a client's disconnect cancelling it, as a stream's), its events folded into the Response
    object of the terminal event, so the JSON answer's output is the stream's, item for item, in the
    model's order (the chat JSON body, one text and its calls after it, cannot say that order). An
    error that ended the stream is its chat error body (``param`` the Responses field) with the
    status the chat JSON answer has (its ``code``)."""
    translator = EventTranslator(body, paths)

    async def fold(message) -> None:
        if message["type"] == "http.response.body":
            translator.events(message.get("body", b""))

    await chat(chat_scope(scope), receive, fold)
    if translator.response is not None:
        return JSONResponse(translator.response, status_code=200)
    if translator.error is not None:
        code = translator.error.get("code")
        return JSONResponse({"error": translator.error}, status_code=code if isinstance(code, int) else 500)
    # the client left (or the server dropped the connection): the stream ended quietly, its request
    # cancelled; nobody reads this answer
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def chat_scope(scope: Scope) -> Scope:
    """`scope` without the server's own send (`TRANSPORT_SEND`): the chat response then writes every
    message through the send it is given (none straight to the transport), which presents it as the
    Responses API's."""
    return {key: value for key, value in scope.items() if key != TRANSPORT_SEND}


class ResponsesStream(Response):
    """The streamed answer: the chat path's streamed response `chat`, its writes presented as the
    Responses API's events (`EventTranslator`)."""

    media_type = "text/event-stream"

    def __init__(self, chat: Response, body: ResponsesRequest, paths: dict[str, str]):
        self.status_code = 200
        self.background = None
        self.raw_headers = []
        self._chat = chat
        self._translator = EventTranslator(body, paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        translator = self._translator

        async def translated(message) -> None:
            if message["type"] != "http.response.body":
                await send(message)
                return
            data, more = translator.feed(message.get("body", b"")), message.get("more_body", False)
            if data or not more:
                await send({"type": "http.response.body", "body": data, "more_body": more})

        await self._chat(chat_scope(scope), receive, translated)
