"""OpenAI-style chat messages and tools: validation into frozen records, and template inputs.

`parse_messages` and `parse_tools` take JSON-decoded request values (dicts, lists, strings) and
return immutable records, raising `MessageError` (HTTP 400) for anything malformed. Conventions:

- content is a string or a list of ``{"type": "text", "text": ...}`` parts; a user message may also
  carry ``image_url`` parts (`helios.frontend.preparation.image_parts`). A message keeps its parts:
  `template_messages` passes them to the template for the roles whose content parts it renders
  itself (`ChatTemplate.content_part_roles`), as `apply_chat_template` passes them, and joins their
  texts with newlines for the others (vLLM's "string" content format: such a template raises on a
  list, or prints its Python repr);
- an assistant message has content, tool calls, or both; its `reasoning_content` (or `reasoning`,
  vLLM's newer name) is optional;
- tool-call arguments are strict JSON text of an object (what the model generated, kept verbatim;
  no ``NaN``/``Infinity``, no number beyond the float range such as ``1e999``, as in the body);
- a tool message answers a call id of the closest preceding assistant message with tool calls.

`template_messages` / `template_tools` build the plain structures a chat template receives (an
assistant's `reasoning_content` also as ``thinking``, as transformers' `apply_chat_template` aliases
it, for templates such as gpt-oss's that read that name). Tool-call
arguments become `ToolArguments`: a read-only mapping of the decoded object that renders as the
original JSON text when printed or concatenated with strings, so templates written for either
Hugging Face convention (``arguments | tojson`` / ``arguments.items()`` or ``'...' + arguments``)
render the same call without a per-template flag.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from helios.errors import RequestError
from helios.frontend.preparation.image_parts import template_parts, user_content
from helios.frontend.preparation.strict_json import NotStrictJSON, strict_loads

MAX_TOOL_NAME_LEN = 64
# The most characters a request's tools may take as JSON indented by `TOOLS_INDENT` per level, the
# widest way a family template prints them (Llama 3's ``tool | tojson(indent=4)``). Indentation is
# no part of the request's size: within the schema bounds (64 KiB, 32 levels a tool) a 4 MiB body of
# deeply nested schemas prints as a few hundred Mi characters, past the template's render bound
# (`helios.frontend.preparation.template.SERVING_BOUNDS`, 64 Mi), which would blame the core's
# template (a 500). A quarter of that bound: room for the conversation, and some 4 M tokens, past
# any context extent in use.
MAX_TOOLS_TEXT_CHARS = 1 << 24
TOOLS_INDENT = 4


class MessageError(RequestError):
    """A chat message or tool definition that cannot be rendered; `param` is the request field that
    holds it (``messages`` or ``tools``; the message gives the place inside)."""

    param = "messages"


class ToolsTooLarge(MessageError):
    """The request's tools print as more JSON text than any prompt can hold (`MAX_TOOLS_TEXT_CHARS`)."""

    param = "tools"


class Role(enum.Enum):
    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object, verbatim


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str | None
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    # Content sent as an array: its parts in order, ("text", text) or ("image", url) (a user message's);
    # `content` is then the texts joined with newlines.
    parts: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str | None
    parameters_json: str | None  # JSON text of the parameters schema object
    strict: bool | None = None  # rendered as the client sent it (templates that print the tool show it)


_KEYS = {
    Role.SYSTEM: {"role", "content", "name"},
    Role.DEVELOPER: {"role", "content", "name"},
    Role.USER: {"role", "content", "name"},
    Role.ASSISTANT: {"role", "content", "name", "reasoning_content", "reasoning", "tool_calls"},
    Role.TOOL: {"role", "content", "tool_call_id", "name"},  # name: the called function's, as clients send it
}


def parse_messages(raw: object) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list) or not raw:
        raise MessageError("messages must be a non-empty array")
    messages = tuple(_parse_message(i, item) for i, item in enumerate(raw))
    _check_tool_responses(messages)
    return messages


def _parse_message(index: int, item: object) -> ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(item, dict):
        raise MessageError(f"{where} must be an object")
    try:
        role = Role(item.get("role"))
    except ValueError:
        raise MessageError(f"{where}.role must be one of {[r.value for r in Role]}") from None
    unknown = set(item) - _KEYS[role]
    if unknown:
        raise MessageError(f"{where} has fields a {role.value} message does not take: {sorted(unknown)}")
    name = _optional_str(item, "name", where)
    if role is Role.ASSISTANT:
        calls = _parse_tool_calls(item.get("tool_calls"), where)
        content, parts = (None, ()) if item.get("content") is None else _content(item["content"], where)
        if content is None and not calls:
            raise MessageError(f"{where}: an assistant message needs content or tool_calls")
        reasoning = _optional_str(item, "reasoning_content", where)
        alias = _optional_str(item, "reasoning", where)  # vLLM's newer name for it
        if alias is not None and reasoning is not None and alias != reasoning:
            raise MessageError(f"{where}: reasoning and reasoning_content differ; send one of them")
        return ChatMessage(role, content, reasoning if reasoning is not None else alias, calls, name=name, parts=parts)
    if role is Role.USER and (mixed := user_content(item.get("content"), where)) is not None:
        return ChatMessage(role, mixed[0], name=name, parts=mixed[1])
    content, parts = _content(item.get("content"), where)
    if role is Role.TOOL:
        call_id = item.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise MessageError(f"{where}.tool_call_id must be a non-empty string")
        return ChatMessage(role, content, tool_call_id=call_id, name=name, parts=parts)
    return ChatMessage(role, content, name=name, parts=parts)


def _optional_str(item: dict, key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise MessageError(f"{where}.{key} must be a string")
    return value


def _content(value: object, where: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(text, parts): a string is its own text with no parts; an array of text parts, its texts
    joined with newlines and its parts."""
    if isinstance(value, str):
        return value, ()
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or set(part) != {"type", "text"}:
                raise MessageError(f"{where}.content[{i}] must be a text part {{type: text, text}}")
            if not isinstance(part["text"], str):
                raise MessageError(f"{where}.content[{i}].text must be a string")
            texts.append(part["text"])
        return "\n".join(texts), tuple(("text", text) for text in texts)
    raise MessageError(f"{where}.content must be a string or an array of text parts")


def _parse_tool_calls(value: object, where: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise MessageError(f"{where}.tool_calls must be an array")
    calls = []
    for i, call in enumerate(value):
        path = f"{where}.tool_calls[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise MessageError(f"{path} must be {{id, type: function, function: {{name, arguments}}}}")
        call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
            raise MessageError(f"{path} needs a non-empty id and function name")
        if not isinstance(arguments, str) or not isinstance(_loads(arguments, path), dict):
            raise MessageError(f"{path}.function.arguments must be JSON text of an object")
        calls.append(ToolCall(call_id, name, arguments))
    return tuple(calls)


def _loads(text: str, where: str) -> Any:
    """Strict JSON, as the request body itself must be: no NaN/Infinity, no overflowing numbers."""
    try:
        return strict_loads(text, unique_keys=False)  # the model's own output may repeat a key
    except NotStrictJSON as error:
        raise MessageError(f"{where}.function.arguments is not strict JSON: {error}") from None
    except (ValueError, RecursionError):
        raise MessageError(f"{where}: invalid JSON") from None


def _check_tool_responses(messages: tuple[ChatMessage, ...]) -> None:
    open_ids: set[str] = set()
    for i, message in enumerate(messages):
        if message.role is Role.ASSISTANT:
            open_ids = {call.id for call in message.tool_calls}
        elif message.role is Role.TOOL:
            if message.tool_call_id not in open_ids:
                raise MessageError(f"messages[{i}] answers no tool call of the preceding assistant message")
        else:
            open_ids = set()


def parse_tools(raw: object) -> tuple[ToolSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MessageError("tools must be an array", "tools")
    check_tools_text(raw)
    tools = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise MessageError(f"{where} must be {{type: function, function: {{name, ...}}}}", "tools")
        name, description, parameters = function.get("name"), function.get("description"), function.get("parameters")
        if not isinstance(name, str) or not 0 < len(name) <= MAX_TOOL_NAME_LEN:
            raise MessageError(f"{where}.function.name must be 1 to {MAX_TOOL_NAME_LEN} characters", "tools")
        if description is not None and not isinstance(description, str):
            raise MessageError(f"{where}.function.description must be a string", "tools")
        if parameters is not None and not isinstance(parameters, dict):
            raise MessageError(f"{where}.function.parameters must be a JSON schema object", "tools")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise MessageError(f"{where}.function.strict must be a boolean", "tools")
        tools.append(ToolSpec(name, description, None if parameters is None else json.dumps(parameters), strict))
    if len({tool.name for tool in tools}) != len(tools):
        raise MessageError("tools: function names must be unique", "tools")
    return tuple(tools)


def check_tools_text(tools: list) -> None:
    """`ToolsTooLarge` when `tools` print as more than `MAX_TOOLS_TEXT_CHARS` characters of JSON
    indented by `TOOLS_INDENT` (counted without printing them, and only until past the bound)."""
    num_chars = indented_json_chars(tools, TOOLS_INDENT, MAX_TOOLS_TEXT_CHARS)
    if num_chars > MAX_TOOLS_TEXT_CHARS:
        raise ToolsTooLarge(
            f"tools: the {len(tools)} tools' definitions print as more than {MAX_TOOLS_TEXT_CHARS} characters of "
            f"JSON indented as chat templates print them ({TOOLS_INDENT} spaces a level), more than any prompt "
            "holds; send fewer tools, or smaller and flatter parameter schemas")


def indented_json_chars(value: Any, indent: int, limit: int) -> int:
    """The length of ``json.dumps(value, indent=indent, ensure_ascii=False)`` without printing it:
    the compact text's, plus each non-empty container's newlines and indentation (a walk over the
    containers only, which stops once past `limit`)."""
    num_chars = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    stack = [(value, 0)] if isinstance(value, (dict, list)) else []
    while stack and num_chars <= limit:
        item, depth = stack.pop()
        if not item:  # [] and {} print as they are
            continue
        is_object = isinstance(item, dict)
        # each entry: a newline and its indent (and an object's space after ":"); then the closing line's
        num_chars += len(item) * (1 + (depth + 1) * indent + is_object) + 1 + depth * indent
        children = item.values() if is_object else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return num_chars


class ToolArguments(dict):
    """Decoded tool-call arguments that print, and concatenate, as their original JSON text.

    The text is held under an underscore name (`json_text` reads it), which the sandbox never shows
    a template: ``arguments.text`` is the argument named ``text``, as for the plain mapping
    transformers renders (an attribute ``text`` rendered the whole JSON text there instead)."""

    def __init__(self, text: str):
        super().__init__(json.loads(text))
        self._text = text

    def __str__(self) -> str:
        return self._text

    def __add__(self, other: object) -> str:
        if isinstance(other, str):
            return self._text + other
        return NotImplemented

    def __radd__(self, other: object) -> str:
        if isinstance(other, str):
            return other + self._text
        return NotImplemented


def json_text(arguments: ToolArguments) -> str:
    """The JSON text `arguments` print as."""
    return arguments._text


def template_messages(messages: tuple[ChatMessage, ...], render_developer_as_system: bool,
                      part_roles: frozenset[str] = frozenset()) -> list[dict]:
    """Plain dicts in the Hugging Face chat-template shape; fresh objects on every call. Content sent
    as parts reaches the template as parts where it has image parts (the template renders each
    image's placeholder) or its rendered role is one of `part_roles` (the template renders text
    parts itself: `ChatTemplate.content_part_roles`); elsewhere as its texts joined with newlines."""
    rendered = []
    for message in messages:
        role = message.role
        if role is Role.DEVELOPER and render_developer_as_system:
            role = Role.SYSTEM
        item: dict[str, Any] = {"role": role.value, "content": message.content}
        if message.parts and (role.value in part_roles or any(kind == "image" for kind, _ in message.parts)):
            item["content"] = template_parts(message.parts)
        if message.name is not None:
            item["name"] = message.name
        if message.reasoning_content is not None:  # also as `thinking`, which gpt-oss's template reads
            item = {"thinking": message.reasoning_content, **item, "reasoning_content": message.reasoning_content}
        if message.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": ToolArguments(c.arguments)}}
                for c in message.tool_calls
            ]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        rendered.append(item)
    return rendered


def template_tools(tools: tuple[ToolSpec, ...]) -> list[dict] | None:
    """Tools in the OpenAI/Hugging Face shape, or None when the request declares none."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.parameters_json is not None:
            function["parameters"] = json.loads(tool.parameters_json)
        if tool.strict is not None:  # templates that print a tool (tojson) print it, as transformers renders it
            function["strict"] = tool.strict
        out.append({"type": "function", "function": function})
    return out
