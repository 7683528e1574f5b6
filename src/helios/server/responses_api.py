"""OpenAI's Responses API (``POST /v1/responses``) over the chat completion path, statelessly.

A `ResponsesRequest` becomes one streamed chat completion body (`chat_request`), which runs through
`ServedModel.respond` exactly as a ``/v1/chat/completions`` request does (validation, admission,
preparation, the engine, disconnect handling, the access log: `helios.server.responses_route`); the
chat stream is presented as the Responses API's typed events (`helios.server.responses_stream`) or,
not streamed, folded into the Response object its terminal event carries, so both forms give the same
output items in the model's order. No response is stored.

The mapping: ``instructions`` is a system message before the input; ``input`` is a user message
(a string) or items in order: messages (``input_text`` / ``output_text`` parts as text,
``input_image`` as an image part), ``function_call`` items as the tool calls of one assistant message
(with the assistant message and reasoning before them), ``function_call_output`` items as tool
messages, ``reasoning`` items as the reasoning of the assistant turn that follows them;
``max_output_tokens`` is ``max_completion_tokens``, ``text.format`` ``response_format``,
``reasoning.effort`` ``reasoning_effort``, ``include: ["message.output_text.logprobs"]`` ``logprobs``
(with ``top_logprobs``; ``top_logprobs`` alone returns nothing, as in OpenAI's API), tools unnested;
``tool_choice`` ``auto`` or ``none`` without tools (the Responses API's default, echoed on every
response) is left out. An error the chat path raises names the Responses field (``max_output_tokens``,
``input[2]``, ``text.format.schema``, ...) in its ``param`` and message; quoted client text (a tool's
name, a value) in the message is never rewritten.

The output, in the model's order: a ``reasoning`` item (``content``: one ``reasoning_text`` part;
``summary`` empty) per stretch of reasoning, a ``message`` item (one ``output_text`` part,
``annotations: []``, and ``logprobs`` when included) per stretch of answer text, a ``function_call``
item per call; an output with no message and no call ends with an empty message. A message's
``logprobs`` hold the entries the chat stream delivered while the message was streamed or, before it,
since the previous message ended (those of reasoning before it included); entries delivered after the
last message ended (calls after it) are in no part. ``status`` is ``completed``, or ``incomplete``
with ``incomplete_details.reason`` ``max_output_tokens`` when the output limit (or the context) ended
it (a message it cut, the last item, is ``incomplete``; items before it were done); an output a
grammar ended early (``grammar_dead_end``, ``grammar_limit``: see the chat finish reasons) is
``incomplete`` with that reason. ``usage`` counts the chat usage's tokens:
``input_tokens_details.cached_tokens`` and ``output_tokens_details.reasoning_tokens`` where the chat
usage has them, else 0.
"""

from __future__ import annotations

import re
import uuid

import pydantic

from helios.errors import HeliosError, RequestError
from helios.server.responses_schema import (
    LOGPROBS_INCLUDE, FunctionCallItem, MessageItem, ReasoningItem, ResponsesRequest,
)
from helios.server.schemas import ChatCompletionRequest


class NoStoredResponses(RequestError):
    """``previous_response_id`` or ``conversation``: this server keeps no responses (HTTP 400)."""


class InvalidResponsesInput(RequestError):
    """An input that does not make a conversation (an image outside a user message, ...)."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- request ---------------------------------------------------------------------------------------


def check_stateless(body: ResponsesRequest) -> None:
    if body.previous_response_id is not None:
        raise NoStoredResponses("previous_response_id is not served: this server keeps no responses (it serves the "
                                "Responses API statelessly); send the whole conversation as input",
                                "previous_response_id")
    if body.conversation is not None:
        raise NoStoredResponses("conversation is not served: this server keeps no conversations; send the whole "
                                "conversation as input", "conversation")


def chat_messages(body: ResponsesRequest) -> tuple[list[dict], dict[str, str]]:
    """The chat messages of `body`'s instructions and input, and where each part of them came from:
    chat paths (``messages[k]``, an assistant message's ``messages[k].content`` and
    ``messages[k].tool_calls[j]``, a tool message's ``messages[k].content``) mapped to the Responses
    fields (``instructions``, ``input``, ``input[i]``, ``input[i].content``, ``input[i].output``; the
    content of the instructions or of a string input is that field); an assistant message made of
    several items is named by its first."""
    messages: list[dict] = []
    paths: dict[str, str] = {}

    def add(message: dict, where: str) -> str:
        key = f"messages[{len(messages)}]"
        messages.append(message)
        paths[key] = where
        return key

    if body.instructions is not None:
        paths[add({"role": "system", "content": body.instructions}, "instructions") + ".content"] = "instructions"
    if isinstance(body.input, str):  # its content is the field itself (no .content under a text)
        paths[add({"role": "user", "content": body.input}, "input") + ".content"] = "input"
        return messages, paths
    turn: dict | None = None  # the assistant message being assembled from consecutive items
    reasoning: list[str] = []  # reasoning items' text, for the next assistant turn
    for index, item in enumerate(body.input):
        where = f"input[{index}]"
        if isinstance(item, ReasoningItem):
            parts = item.content if item.content is not None else item.summary
            reasoning.append("".join(part.text for part in parts))
            continue
        is_message = isinstance(item, MessageItem)
        is_assistant = isinstance(item, FunctionCallItem) or (is_message and item.role == "assistant")
        if not is_assistant:
            turn, reasoning = None, []  # reasoning that no assistant turn follows is dropped
        elif turn is None or (is_message and (turn.get("content") is not None or "tool_calls" in turn)):
            # a new assistant message: text after the turn's text or calls is a message of its own
            turn = {"role": "assistant", "content": None}
            turn_key = add(turn, where)
        if reasoning and turn is not None:
            turn["reasoning_content"] = turn.get("reasoning_content", "") + "".join(reasoning)
            reasoning = []
        if isinstance(item, FunctionCallItem):
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": function}
            paths[f"{turn_key}.tool_calls[{len(turn.setdefault('tool_calls', []))}]"] = where
            turn["tool_calls"].append(call)
        elif isinstance(item, MessageItem) and turn is not None:
            turn["content"] = _content(item, where)
            paths[f"{turn_key}.content"] = f"{where}.content"
        elif isinstance(item, MessageItem):
            add({"role": item.role, "content": _content(item, where)}, where)
        else:  # function_call_output
            output = item.output
            if not isinstance(output, str):
                output = [{"type": "text", "text": part.text} for part in output]
            tool = {"role": "tool", "tool_call_id": item.call_id, "content": output}
            if item.name is not None:
                tool["name"] = item.name
            key = add(tool, where)
            paths[f"{key}.content"] = f"{where}.output"
    if not messages:
        raise InvalidResponsesInput("input holds no message, function call or function call output (reasoning "
                                    "items alone make no conversation)", "input")
    return messages, paths


def _content(item: MessageItem, where: str):
    if isinstance(item.content, str):
        return item.content
    parts = []
    for index, part in enumerate(item.content):
        if part.type == "input_image":
            if item.role != "user":
                raise InvalidResponsesInput(f"{where}.content[{index}]: an input_image part belongs to a user message, "
                                            f"not a {item.role} message", f"{where}.content[{index}]")
            image = {"url": part.image_url} if part.detail is None else {"url": part.image_url, "detail": part.detail}
            parts.append({"type": "image_url", "image_url": image})
        else:
            parts.append({"type": "text", "text": part.text})
    return parts


def chat_request(body: ResponsesRequest) -> tuple[ChatCompletionRequest, dict[str, str]]:
    """The chat completion body that answers `body`, and where its messages came from (`chat_messages`)."""
    check_stateless(body)
    messages, paths = chat_messages(body)
    # streamed either way: a JSON answer is the stream's events folded (`responses_stream.folded_response`)
    chat: dict = {"model": body.model, "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    for name, value in (("max_completion_tokens", body.max_output_tokens), ("temperature", body.temperature),
                        ("top_p", body.top_p), ("user", body.user), ("parallel_tool_calls", body.parallel_tool_calls),
                        ("safety_identifier", body.safety_identifier), ("prompt_cache_key", body.prompt_cache_key),
                        ("service_tier", body.service_tier)):
        if value is not None:
            chat[name] = value
    if body.tools is not None:
        chat["tools"] = [{"type": "function",
                          "function": tool.model_dump(exclude={"type"}, exclude_none=True, by_alias=True)}
                         for tool in body.tools]
    if body.tool_choice is not None and (body.tools or body.tool_choice not in ("auto", "none")):
        # auto (the Responses API's default, echoed on every response) and none say nothing without tools:
        # left out, as the chat path refuses auto without tools; required or a named function stays its 400
        choice = body.tool_choice
        named = None if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
        chat["tool_choice"] = named or choice
    text_format = body.text.format if body.text is not None else None
    if text_format is not None and text_format.type == "json_schema":
        schema = text_format.model_dump(exclude={"type"}, exclude_none=True, by_alias=True)
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif text_format is not None:
        chat["response_format"] = {"type": text_format.type}
    if body.reasoning is not None and body.reasoning.effort is not None:
        chat["reasoning_effort"] = body.reasoning.effort
    if LOGPROBS_INCLUDE in (body.include or ()):
        chat["logprobs"] = True
        if body.top_logprobs is not None:
            chat["top_logprobs"] = body.top_logprobs
    try:
        return ChatCompletionRequest.model_validate(chat), paths
    except pydantic.ValidationError as error:  # a bound the chat body has beyond the Responses body's
        first = error.errors()[0]
        raise InvalidResponsesInput(f"the request makes no valid chat conversation: {first.get('msg', 'invalid')}",
                                    responses_param(_chat_loc(first.get("loc", ())), paths)) from None


def _chat_loc(loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


# chat fields and the Responses fields that set them (errors' params and messages name the latter)
_CHAT_PARAMS = {"max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
                "response_format": "text.format", "reasoning_effort": "reasoning.effort", "logprobs": "include",
                "chat_template_kwargs": "reasoning.effort", "messages": "input"}
# chat field paths whose Responses field is spelled differently below its top level (the schema and the
# named function unnested)
_CHAT_PATHS = {"response_format.json_schema": "text.format", "tool_choice.function": "tool_choice"}
# a chat field named in an error's message: a path (`_CHAT_PATHS`) or a field (`_CHAT_PARAMS`); a quoted span
# (the client's text: a tool's name, a value) is matched first and kept as it is
_CHAT_WORDS = re.compile(r"""(?<!\w)'(?:[^'\\]|\\.)*'(?!\w)|(?<!\w)"(?:[^"\\]|\\.)*"|"""
                         r"\b(response_format\.json_schema|tool_choice\.function|max_completion_tokens|response_format"
                         r"|reasoning_effort)\b")
# a chat path into the messages: the message, its tool calls or one of them (its function's fields unnested) or
# the content
_MESSAGE_PATH = re.compile(r"\bmessages\[(\d+)\](?:(\.tool_calls(?:\[\d+\])?)(?:\.function)?|(\.content))?")
_TOOL_PARAM = re.compile(r"^tools\[(\d+)\]\.function")


def _responses_path(match: re.Match, paths: dict[str, str]) -> str:
    message = f"messages[{match.group(1)}]"
    part = match.group(2) or match.group(3) or ""
    if part == ".tool_calls":  # a turn's calls as a whole (their count): the turn's first function_call item
        part = ".tool_calls[0]"
    if message + part in paths:
        return paths[message + part]
    return paths.get(message, "input") + part  # the content of a message item (the same parts)


def responses_param(param: str | None, paths: dict[str, str]) -> str | None:
    """The Responses field a chat error's ``param`` names (`chat_messages`' `paths`)."""
    if not param:
        return param
    if _MESSAGE_PATH.match(param):
        return _MESSAGE_PATH.sub(lambda match: _responses_path(match, paths), param, count=1)
    if _TOOL_PARAM.match(param):
        return _TOOL_PARAM.sub(r"tools[\1]", param)
    for chat, responses in _CHAT_PATHS.items():
        if param == chat or param.startswith(chat + "."):
            return responses + param[len(chat):]
    renamed = _CHAT_PARAMS.get(param.partition(".")[0].split("[")[0])
    return renamed if renamed is not None else param


def renamed_error(error: BaseException, paths: dict[str, str]) -> BaseException:
    """`error` (raised by the chat path) naming the Responses fields, in its ``param`` and message."""
    param = getattr(error, "param", None)
    if isinstance(error, HeliosError) and isinstance(param, str):
        error.param = responses_param(param, paths)
    if isinstance(error, RequestError) and len(error.args) == 1 and isinstance(error.args[0], str):
        place = _MESSAGE_PATH.match(error.args[0])
        if param == "messages" and place is not None:  # a message error names the place in its text alone
            error.param = _responses_path(place, paths)
        error.args = (responses_words(error.args[0], paths),)
    return error


def responses_words(message: str, paths: dict[str, str]) -> str:
    """A chat error's message with the chat fields it names spelled as the Responses fields."""
    message = _MESSAGE_PATH.sub(lambda match: _responses_path(match, paths), message)

    def renamed(match: re.Match) -> str:
        word = match.group(1)
        return match.group(0) if word is None else _CHAT_PATHS.get(word) or _CHAT_PARAMS[word]

    return _CHAT_WORDS.sub(renamed, message)


# -- response --------------------------------------------------------------------------------------


def response_shell(body: ResponsesRequest, response_id: str, created_at: int, model: str) -> dict:
    """A Response object without its outcome (``output`` empty, ``status`` in progress): the
    request's settings as OpenAI echoes them."""
    text_format = body.text.format if body.text is not None and body.text.format is not None else None
    tool_choice = body.tool_choice or "auto"
    text = text_format.model_dump(by_alias=True, exclude_none=True) if text_format else {"type": "text"}
    return {
        "id": response_id, "object": "response", "created_at": created_at, "status": "in_progress",
        "background": False, "error": None, "incomplete_details": None, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "max_tool_calls": None, "model": model, "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False, "previous_response_id": None,
        "reasoning": {"effort": body.reasoning.effort, "summary": body.reasoning.summary} if body.reasoning else None,
        # the tier that serves the request (OpenAI's response names that, not the one asked for): Helios has one
        "service_tier": "default", "store": False, "temperature": body.temperature,
        "text": {"format": text},
        "tool_choice": tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(),
        "tools": [tool.model_dump(by_alias=True) for tool in body.tools or ()],
        "top_logprobs": body.top_logprobs, "top_p": body.top_p, "truncation": "disabled",
        "usage": None, "user": body.user, "metadata": dict(body.metadata or {}),
    }


def outcome(finish_reason: str | None) -> tuple[str, dict | None]:
    """A chat finish reason's Response ``status`` and ``incomplete_details``."""
    if finish_reason in ("stop", "tool_calls"):
        return "completed", None
    reason = "max_output_tokens" if finish_reason == "length" else finish_reason
    return "incomplete", {"reason": reason}


def usage_object(usage: dict | None) -> dict | None:
    """The Responses usage of a chat usage (details 0 where the chat usage has none)."""
    if usage is None:
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": usage["total_tokens"]}


def reasoning_item(item_id: str, text: str) -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def text_part(text: str, logprobs: list | None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def message_item(item_id: str, status: str, text: str, logprobs: list | None) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [text_part(text, logprobs)]}


def function_call_item(item_id: str, status: str, call_id: str, name: str, arguments: str) -> dict:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


def output_logprobs(chat_logprobs: dict | None) -> list | None:
    """A chat choice's ``logprobs`` as an ``output_text`` part's (None: not asked for)."""
    if chat_logprobs is None:
        return None
    return [{"token": e["token"], "bytes": e["bytes"], "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "bytes": t["bytes"], "logprob": t["logprob"]}
                              for t in e.get("top_logprobs") or ()]}
            for e in chat_logprobs.get("content") or ()]
