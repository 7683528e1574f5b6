"""JSON tool calls (`ToolSyntaxKind.JSON_CALLS`): whole JSON invocations inside an optional block.

Spellings served (all from `JsonCallSyntax` data, none keyed by model identity)::

    <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>          Hermes style (Qwen2.5, Qwen3)
    [TOOL_CALLS][{"name": "f", "arguments": {...}}]                       Mistral (block runs to the end)
    [TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}                     newer Mistral (the block opener
                                                                          opens the first call too)
    {"name": "f", "parameters": {...}}                                    Llama 3.x (no opener: the answer
                                                                          is a call when it starts with `{`)
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...
                                                                          DeepSeek V3 (V3.1 without fence)

Answer text is released as soon as it cannot start the opener; a block is parsed when its closer
arrives (or at the end of output when it has none), so arguments are emitted whole, once per call.
Recovery (never raising from ``feed``): a block that does not parse is answer text with
`MALFORMED_CALL`; so is a block whose body starts with text no call starts with (not JSON, or not
the invocation opener), decided at that text's first character: the opener was prose ("I will use
<tool_call> tags"), and an opener in the answer text after it opens the real block. Calls naming
unregistered functions are dropped with `UNKNOWN_TOOL` (the block is answer text when no call
remains); output ending inside a block that has a closer parses what is there with
`UNTERMINATED_CALL` (calls then end with ``complete=False``).
"""

from __future__ import annotations

from dataclasses import dataclass

from helios.frontend.decoding.events import (
    ContentDelta,
    Event,
    MarkupDropped,
    ParseError,
    ParseErrorKind,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from helios.frontend.parsers.calls import DETAIL_LEN, CallIds
from helios.frontend.parsers.start import AnswerMode
from helios.frontend.parsers.tool_grammar import NameRule
from helios.frontend.parsers.values import STRICT_JSON, dump_json, parse_json
from helios.frontend.decoding.syntax import JsonCallSyntax

_DECODER = STRICT_JSON  # NaN, Infinity and 1e999 are not JSON: such a block is malformed
# Between calls, besides whitespace: any character `str.isspace` accepts (U+00A0, U+3000, U+2028...), as
# the `str.lstrip` that decides an answer opens a block reads it, so whitespace before a call is not JSON.
_SEPARATORS = ",;"
_JSON_STARTS = "{["
# A call object's arguments under the other of the two spellings models use (Llama 3's template asks
# for "parameters", fine-tunes of it write "arguments", and the reverse): read, not silently dropped.
_ARGUMENTS_ALIASES = {"parameters": "arguments", "arguments": "parameters"}


class MalformedCalls(ValueError):
    """A block body that does not follow the syntax."""


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # the arguments object as JSON text


def parse_block(body: str, syntax: JsonCallSyntax) -> list[ParsedCall]:
    """The calls of one block body (MalformedCalls when it does not follow the syntax)."""
    if syntax.name_key:
        return _object_calls(body, syntax)
    return _named_calls(body, syntax)


def _object_calls(body: str, syntax: JsonCallSyntax) -> list[ParsedCall]:
    calls, at = [], _skip(body, 0, _SEPARATORS)
    while at < len(body):
        try:
            value, at = _DECODER.raw_decode(body, at)
        except (ValueError, RecursionError) as error:
            raise MalformedCalls(f"not JSON at {at}: {error}") from None
        for item in value if isinstance(value, list) else [value]:
            calls.append(_object_call(item, syntax))
        at = _skip(body, at, _SEPARATORS)
    if not calls:
        raise MalformedCalls("no call in the block")
    return calls


def _object_call(item: object, syntax: JsonCallSyntax) -> ParsedCall:
    if not isinstance(item, dict) or not isinstance(item.get(syntax.name_key), str):
        raise MalformedCalls(f"a call is an object with a string {syntax.name_key!r}")
    key = syntax.arguments_key
    if key not in item and _ARGUMENTS_ALIASES.get(key) in item:  # the other common spelling: not dropped
        key = _ARGUMENTS_ALIASES[key]
    arguments = item.get(key)
    if arguments is None:  # absent, or `null` as models write for a call without arguments: no arguments
        arguments = {}
    if isinstance(arguments, str):  # some models write the arguments object as a JSON string
        try:
            arguments = parse_json(arguments)
        except (ValueError, RecursionError):
            raise MalformedCalls(f"{key!r} is not a JSON object") from None
    if not isinstance(arguments, dict):
        raise MalformedCalls(f"{key!r} is not a JSON object")
    return ParsedCall(item[syntax.name_key], _arguments_text(arguments))


def _arguments_text(arguments: dict) -> str:
    try:
        return dump_json(arguments)
    except RecursionError:
        raise MalformedCalls("arguments nested too deeply") from None


def _named_calls(body: str, syntax: JsonCallSyntax) -> list[ParsedCall]:
    calls, at = [], _skip(body, 0)
    # A block opener that is also the invocation opener (`[TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}`)
    # opened the first call too; a body that repeats it (as forced-call grammars write it) is read as well.
    is_first_open = syntax.block_open == syntax.invoke_open and not body.startswith(syntax.invoke_open, at)
    while at < len(body):
        if not (is_first_open and not calls):
            at = _expect(body, at, syntax.invoke_open)
        end = body.find(syntax.name_end, at)
        if end < 0:
            raise MalformedCalls("a function name is not terminated")
        name, at = body[at:end].strip(), end + len(syntax.name_end)
        at = _expect(body, _skip(body, at), syntax.arguments_open)
        try:
            arguments, at = _DECODER.raw_decode(body, _skip(body, at))
        except (ValueError, RecursionError) as error:
            raise MalformedCalls(f"arguments of {name!r} are not JSON: {error}") from None
        if not isinstance(arguments, dict) or not name:
            raise MalformedCalls(f"call {name!r} has no JSON object arguments")
        at = _expect(body, _skip(body, at), syntax.arguments_close.strip())
        at = _skip(body, _expect(body, _skip(body, at), syntax.invoke_close))
        calls.append(ParsedCall(name, _arguments_text(arguments)))
    if not calls:
        raise MalformedCalls("no call in the block")
    return calls


def _skip(text: str, at: int, separators: str = "") -> int:
    """The first index from `at` that is neither whitespace nor one of `separators`."""
    while at < len(text) and (text[at].isspace() or text[at] in separators):
        at += 1
    return at


def _expect(text: str, at: int, spelling: str) -> int:
    if not spelling:
        return at
    if not text.startswith(spelling, at):
        raise MalformedCalls(f"expected {spelling!r} at {at}")
    return at + len(spelling)


def _partial_suffix_len(text: str, spelling: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `spelling`."""
    for n in range(min(len(text), len(spelling) - 1), 0, -1):
        if spelling.startswith(text[-n:]):
            return n
    return 0


class JsonCallParser:
    """Answer text -> content and tool-call events for one output (one thread)."""

    def __init__(self, syntax: JsonCallSyntax, names: NameRule, ids: CallIds,
                 answer: AnswerMode = AnswerMode.FREE):
        self._syntax, self._names, self._ids, self._answer = syntax, names, ids, answer
        # Undecided answer text (trailing whitespace, a possible opener prefix) is `_held_ws` then
        # `_held`. `_held_ws` is known to be whitespace and is joined only once decided; `_held` is the
        # last len(opener) - 1 held characters (all of them while `_held_ws` is empty), all a feed
        # needs to find an opener split across feeds. So held whitespace is never scanned again.
        self._held = ""
        self._held_ws: list[str] = []
        self._block: list[str] | None = None  # body text of an open block
        self._is_body_started = False  # the open block's body has text that may start a call
        self._block_tail = ""  # the body's last len(closer) - 1 characters: where a closer may start
        self._opaque = False  # a structured answer started: everything is answer text
        self._lead = ""  # whitespace between the answer and the open block's opener
        self._seen_text = False

    def feed(self, token_id: int, text: str) -> list[Event]:
        if self._block is not None:
            return self._block_text(text)
        return self._content(text)

    def finish(self) -> list[Event]:
        if self._block is not None:
            unterminated = bool(self._syntax.block_close)
            body = "".join(self._block)
            self._block = None
            return self._emit_block(body, "", unterminated)
        held = self._take_held_ws() + self._held
        self._held = ""
        return [ContentDelta(held)] if held else []

    def _content(self, new: str) -> list[Event]:
        """Decides answer text. ``text`` below is `_held` and the new text; the whole undecided text
        is `_held_ws` (whitespace) then ``text``, so what follows reads it as if it were whole:
        ``text`` holds any opener that ends in the new text and any opener prefix at the end, and
        stripping whitespace from the whole is stripping it from ``text`` (plus `_held_ws`)."""
        text, self._held = self._held + new, ""
        opener = self._syntax.block_open
        if self._opaque:
            return [ContentDelta(text)] if text else []
        if not opener:
            return self._answer_start(text)
        at = text.find(opener)
        if at >= 0:
            before, after = text[:at], text[at + len(opener):]
            if self._answer is AnswerMode.STRUCTURED and before.strip():
                return self._to_opaque(self._take_held_ws() + text)
            answer = before.rstrip()
            lead = before[len(answer):]  # whitespace before an opener is its lead
            if answer:
                answer = self._take_held_ws() + answer
            else:
                lead = self._take_held_ws() + lead
            self._lead = lead
            events = [ContentDelta(answer)] if answer else []
            return events + self._open_block(after)
        if self._answer is AnswerMode.STRUCTURED and text.strip() and not opener.startswith(text.lstrip()[:len(opener)]):
            return self._to_opaque(self._take_held_ws() + text)
        partial = _partial_suffix_len(text, opener)
        answer_len = len(text[: len(text) - partial].rstrip())
        released = self._take_held_ws() + text[:answer_len] if answer_len else ""
        # text[answer_len:] is held: whitespace, then the opener prefix (at most len(opener) - 1)
        split = max(answer_len, len(text) - len(opener) + 1)
        if split > answer_len:
            self._held_ws.append(text[answer_len:split])
        self._held = text[split:]
        return [ContentDelta(released)] if released else []

    def _answer_start(self, text: str) -> list[Event]:
        """No opener: the answer is a block when its first non-whitespace character starts JSON."""
        stripped = text.lstrip()
        if not stripped:
            if text:
                self._held_ws.append(text)
            return []
        text = self._take_held_ws() + text
        if self._answer is AnswerMode.STRUCTURED or stripped[0] not in _JSON_STARTS:
            return self._to_opaque(text)
        self._lead = ""
        return self._open_block(text)

    def _take_held_ws(self) -> str:
        held, self._held_ws = "".join(self._held_ws), []
        return held

    def _to_opaque(self, text: str) -> list[Event]:
        """``text`` is the whole undecided text (callers have taken `_held_ws`)."""
        self._opaque = True
        return [ContentDelta(text)] if text else []

    def _open_block(self, text: str) -> list[Event]:
        self._block, self._block_tail, self._is_body_started = [], "", False
        return self._block_text(text)

    def _block_text(self, text: str) -> list[Event]:
        """Adds body text to the open block and ends the block at its closer. Only the text where
        a closer may start is searched, so a long block streamed in small pieces costs linear time."""
        self._block.append(text)
        if not self._is_body_started:
            prose = self._prose_block()
            if prose is not None:
                return prose
        closer = self._syntax.block_close
        if not closer:
            return []
        window = self._block_tail + text
        at = window.find(closer)
        if at < 0:
            self._block_tail = window[max(0, len(window) - len(closer) + 1) :]
            return []
        body = "".join(self._block)
        at += len(body) - len(window)
        self._block = None
        events = self._emit_block(body[:at], closer, unterminated=False)
        rest = body[at + len(closer):]
        return events + (self._content(rest) if rest else [])

    def _prose_block(self) -> list[Event] | None:
        """Events of an open block whose body starts with text no call starts with: its lead and opener
        are answer text and its body is answer text again, where a later opener opens a block (the
        prose that named the opener used to take the real call after it to the closer, all answer
        text). None while the body may still start a call. Only the body's leading whitespace is
        scanned again; after its first other character the body is decided."""
        syntax = self._syntax
        body = "".join(self._block)
        if syntax.name_key:
            rest = body[_skip(body, 0, _SEPARATORS):]
            may_start, self._is_body_started = not rest or rest[0] in _JSON_STARTS, bool(rest)
        elif syntax.invoke_open and syntax.invoke_open != syntax.block_open:
            rest, opener = body[_skip(body, 0):], syntax.invoke_open
            may_start, self._is_body_started = opener.startswith(rest[: len(opener)]), rest.startswith(opener)
        else:  # the name follows the opener: no text tells prose apart
            may_start = self._is_body_started = True
        if may_start:
            return None
        raw = self._lead + syntax.block_open
        self._lead, self._block = "", None
        return [ContentDelta(raw), ParseError(ParseErrorKind.MALFORMED_CALL, "text before the first call"),
                *self._content(body)]

    def _emit_block(self, body: str, closer: str, unterminated: bool) -> list[Event]:
        """Events of a complete block: its calls (the block's text is markup), or, when it holds no
        acceptable call, its whole text (lead whitespace, opener, body, closer) as answer text."""
        raw = self._lead + self._syntax.block_open + body + closer
        self._lead = ""
        try:
            calls = parse_block(body, self._syntax)
        except MalformedCalls as error:
            kind = ParseErrorKind.UNTERMINATED_CALL if unterminated else ParseErrorKind.MALFORMED_CALL
            return [ContentDelta(raw), ParseError(kind, f"{error}: {body[:DETAIL_LEN]!r}")]
        events: list[Event] = []
        accepted = []
        for call in calls:
            problem = self._names.check(call.name)
            if problem is not None:
                events.append(problem)
            else:
                accepted.append(call)
        if not accepted:
            return [ContentDelta(raw), *events]
        events.append(MarkupDropped(raw))
        for call in accepted:
            index, call_id = self._ids.allocate()
            events += [
                ToolCallStart(index, call_id, call.name),
                ToolCallArguments(index, call.arguments),
                ToolCallEnd(index, not unterminated),
            ]
        if unterminated:
            events.append(ParseError(ParseErrorKind.UNTERMINATED_CALL, body[:DETAIL_LEN]))
        return events
