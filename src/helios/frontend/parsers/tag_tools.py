"""The incremental tool-call parser shared by the tag syntaxes (Qwen Coder, GLM, DSML, XTML, ATEM).

A family module turns its syntax data into a `ToolGrammar`; `TagToolParser` runs it::

    answer text  BLOCK_OPEN  [inline NAME NAME_SEPARATOR | INVOKE_OPEN(name)]
                   KEY_OPEN(key[, string flag]) [VALUE_OPEN] value VALUE_CLOSE  ...
                 [INVOKE_CLOSE ... more invocations]  BLOCK_CLOSE  answer text ...

Whitespace between structural tags is a separator. Text is released as soon as it is decided
(`helios.frontend.parsers.scan`), so events are the same in total for any feed chunking.

Recovery (never raising from ``feed``); "raw" text goes to answer content when the parser reads
answer text (`StrayText.CONTENT`) and to `MarkupDropped` inside recipient tool frames
(`StrayText.ERROR`):

- unknown invocation name (`UNKNOWN_TOOL`), a named recipient's mismatch (`RECIPIENT_MISMATCH`),
  an invocation beyond the frame limit (`EXTRA_INVOCATION`), or non-whitespace text before a block's
  first invocation (`MALFORMED_CALL`): if the block has no started call yet, the whole block up to
  and including its closer is raw; otherwise that invocation up to its closer is raw. A block
  opener before a block's first invocation, or in the raw text of a block rejected for text before
  it (an inline name holding whitespace is such text), ends the raw text there and opens a block
  (prose that names the opener does not swallow the call after it); in a rejected invocation's raw
  text it is raw text (an example call quoted in an unknown tool's argument is no call);
- a value closer is the value's end only where whitespace and then a tag that may follow a value
  (a key, the invocation or block closer) or the end of the output follow it; before other text it
  is value text (templates write values unescaped: ``x</parameter>y`` is one value);
- a value whose closer was left out (``ToolGrammar.unclosed_value_ends``: Qwen Coder, and XTML,
  whose escaped values hold no tag): a tag that may follow a value right after the value wrap
  (``VALUE\n<parameter=b>``, ``VALUE\n</function>``) ends the value and is read as that tag,
  `MALFORMED_CALL`, as the reference parsers (vLLM's and Qwen's qwen3coder) end a value at the next
  key or the invocation closer; elsewhere in a value such a tag is value text (``see <parameter=x>
  here`` is one value);
- stray text inside a started call: `UNEXPECTED_TEXT` with the complete run, dropped;
- a typed value that does not parse: kept as a JSON string, `INVALID_VALUE`;
- a block closer while an invocation is open: the call ends normally, `MALFORMED_CALL`;
- an invocation tag in answer text (``ToolGrammar.bare_invocations``: Qwen Coder's ``<function=NAME>``
  written without ``<tool_call>``, which vLLM's parser reads as a call): a registered tool's at the
  start of a line opens a call in a block of its own that the invocation closer ends; another
  name's tag, or one mid-line, is answer text;
- output ending inside a started call (the output limit, a stop string, EOS): no call, the call's
  text from its invocation tag on (the block opener too for a block's first call) is answer content,
  also in tool frames, with `UNTERMINATED_CALL`; so that the stream agrees, a call's events are held
  from its invocation tag until it ends and are released together; calls that ended before stay
  calls; ending inside a block with no started call: the block's text is content (in tool frames
  too), `UNTERMINATED_CALL`.
"""

from __future__ import annotations

import enum

from helios.frontend.decoding.events import ContentDelta, Event, MarkupDropped, ParseError, ParseErrorKind, ToolCallStart
from helios.frontend.parsers.calls import CallIds, OpenCall, ValueMode
from helios.frontend.parsers.tool_grammar import NameRule, StrayText, ToolGrammar
from helios.frontend.parsers.scan import MAX_CAPTURE_LEN, TagForm, TagSet
from helios.frontend.parsers.start import AnswerMode
from helios.frontend.parsers.text import held_tail_len, strip_tail_len


class _S(enum.Enum):
    CONTENT = 1
    BLOCK = 2
    NAME = 3
    INVOKE = 4
    KEY = 5
    VALUE = 6
    REJECT_BLOCK = 7
    REJECT_INVOKE = 8
    OPAQUE = 9
    CLOSING = 10  # after a value closer: the value's end, or value text (decided by what follows)
    REJECT_PROSE = 11  # a block rejected for text before its first invocation: a block opener opens a block


def _tags(**forms: TagForm | str) -> TagSet:
    return TagSet({k: v if isinstance(v, TagForm) else TagForm(v) for k, v in forms.items() if v})


class TagToolParser:
    """Parses answer text (or a tool frame body) into content and tool-call events.

    ``feed(token_id, text)`` ignores the id: tool markup is recognised in text. One instance serves
    one output (or one frame) and is driven by one thread; ``ids`` may be shared with other parsers
    of the same output.
    """

    def __init__(self, grammar: ToolGrammar, names: NameRule, ids: CallIds,
                 stray: StrayText = StrayText.CONTENT, answer: AnswerMode = AnswerMode.FREE):
        g = self._g = grammar
        self._names, self._ids, self._stray_mode, self._answer = names, ids, stray, answer
        end = g.invoke_close or g.block_close
        self._sets = {
            _S.CONTENT: _tags(open=g.block_open, bare=g.invoke_open if g.bare_invocations else ""),
            _S.BLOCK: _tags(invoke=g.invoke_open, close=g.block_close, open=g.block_open),
            _S.NAME: _tags(sep=g.name_separator, key=g.key_open, close=g.block_close, open=g.block_open),
            _S.INVOKE: _tags(key=g.key_open, end=end, close=g.block_close if g.invoke_close else ""),
            _S.KEY: _tags(value=g.value_open, key=g.key_open, end=g.block_close),
            _S.VALUE: _tags(closer=g.value_close, **g.value_end_tags()),
            _S.REJECT_BLOCK: _tags(close=g.block_close),
            _S.REJECT_PROSE: _tags(close=g.block_close, open=g.block_open),
            _S.REJECT_INVOKE: _tags(close=g.invoke_close or g.block_close),
        }
        self._state = _S.CONTENT
        self._buf = ""
        # Answer whitespace that may turn out to be block wrapping, joined only once decided: after a
        # block, a run of any length (each part is whitespace, so it is never scanned again);
        # elsewhere at most len(block_lead) characters.
        self._pending_ws: list[str] = []
        self._after_block = False
        self._raw: list[str] = []  # block text before its first started call (raw if rejected)
        self._stray: list[str] = []
        self._closing: list[str] = []  # a value closer and the whitespace after it, while CLOSING
        self._name: list[str] = []
        self._key = ""
        self._block_calls = 0
        self._bare = False  # the open block is a bare invocation's: its invocation closer ends it
        self._at_line_start = True  # the answer text so far ends a line (or there is none): a bare tag may open
        self._num_calls = 0
        self._call: OpenCall | None = None
        self._held: list[Event] = []  # the open call's events, released when it ends
        self._call_text: list[str] = []  # the open call's text from its invocation tag on (raw if unterminated)

    def feed(self, token_id: int, text: str) -> list[Event]:
        if self._call is not None:
            self._call_text.append(text)
        self._buf += text
        out: list[Event] = []
        self._run(out, final=False)
        return out

    def finish(self) -> list[Event]:
        """Ends the output. An undecided tail inside tool markup (a tag cut off by the end) belongs
        to the unterminated markup; elsewhere it is text."""
        out: list[Event] = []
        if self._state is _S.CLOSING:
            self._end_value(self._held)
        if self._state not in (_S.CONTENT, _S.OPAQUE, _S.REJECT_BLOCK, _S.REJECT_INVOKE, _S.REJECT_PROSE):
            tail, self._buf = self._buf, ""
            if self._state in (_S.BLOCK, _S.NAME) and not self._block_calls:
                self._name.append(tail)
            else:
                self._markup(self._held if self._call is not None else out, tail)
        self._run(out, final=True)
        self._finish_state(out)
        return out

    def _run(self, out: list[Event], final: bool) -> None:
        while self._buf and self._step(self._held if self._call is not None else out, final):
            self._release_ended_call(out)
        self._release_ended_call(out)

    def _release_ended_call(self, out: list[Event]) -> None:
        """A call that ended (its closer read): its held events go out, in order."""
        if self._call is None and self._held:
            out.extend(self._held)
            self._held, self._call_text = [], []

    def _step(self, out: list[Event], final: bool) -> bool:
        """Consumes what the current state can decide; False when it must wait for more text."""
        if self._state is _S.OPAQUE:
            out.append(ContentDelta(self._buf))
            self._buf = ""
            return False
        if self._state is _S.CONTENT and self._answer_begins(final):
            self._state = _S.OPAQUE
            self._buf = self._take_pending() + self._buf
            return True
        if self._state is _S.CLOSING:
            return self._closing_step(out, final)
        buf = self._buf
        safe, tag = self._sets[self._state].find(buf, final)
        changed = self._text(out, buf[:safe])
        if tag is None or changed:
            self._buf = buf[safe:]
            return changed
        self._buf = buf[tag.end :]
        self._tag(out, tag.label, tag.captures, buf[tag.start : tag.end])
        return True

    def _answer_begins(self, final: bool) -> bool:
        if self._answer is not AnswerMode.STRUCTURED or self._stray_mode is not StrayText.CONTENT:
            return False
        rest = self._buf.lstrip()
        opener = self._g.block_open
        return bool(rest) and not rest.startswith(opener) and (final or not opener.startswith(rest))

    # Text between tags, by state. True when it changed the state (the scan must start over).

    def _text(self, out: list[Event], text: str) -> bool:
        state = self._state
        if not text:
            return False
        if state is _S.CONTENT:
            self._answer_text(out, text)
        elif state is _S.BLOCK and not self._block_calls:
            self._raw.append(text)
            if text.strip():
                self._reject_block(out, ParseError(ParseErrorKind.MALFORMED_CALL, "text before the first invocation"),
                                   _S.REJECT_PROSE)
                return True
        elif state is _S.NAME:
            self._name.append(text)
            if len("".join(self._name)) > MAX_CAPTURE_LEN:
                self._raw.append("".join(self._name))
                self._reject_block(out, ParseError(ParseErrorKind.MALFORMED_CALL, "invocation name too long"),
                                   _S.REJECT_PROSE)
                return True
        elif state is _S.VALUE:
            out.extend(self._call.value_text(text))
        elif state in (_S.REJECT_BLOCK, _S.REJECT_INVOKE, _S.REJECT_PROSE):
            self._raw_out(out, text)
        else:  # BLOCK after a started call, INVOKE, KEY
            self._stray.append(text)
        return False

    def _answer_text(self, out: list[Event], text: str) -> None:
        if text:
            self._at_line_start = text.endswith("\n")
        if self._stray_mode is StrayText.ERROR:
            self._stray.append(text)
            return
        if self._after_block:
            if not text.strip():  # what is pending after a block is whitespace too
                self._pending_ws.append(text)
                return
            self._after_block = False
        text = self._take_pending() + text
        hold = held_tail_len(text, self._g.block_lead)
        self._pending_ws = [text[len(text) - hold :]] if hold else []
        if hold < len(text):
            out.append(ContentDelta(text[: len(text) - hold]))

    # Tags, by state.

    def _tag(self, out: list[Event], label: str, captures: tuple[str, ...], tag_text: str) -> None:
        state = self._state
        if state is _S.CONTENT and label == "bare":
            self._open_bare(out, captures[0], tag_text)
        elif state is _S.CONTENT:
            self._open_block(out, tag_text)
        elif label == "open" and state in (_S.BLOCK, _S.NAME):
            self._block_opener(out, tag_text)
        elif state is _S.BLOCK:
            if label == "invoke":
                self._start_invoke(out, captures[0], tag_text)
            else:
                self._close_empty_or_block(out, tag_text)
        elif state is _S.NAME:
            self._end_inline_name(out, label, tag_text)
        elif state in (_S.INVOKE, _S.KEY):
            self._call_tag(out, label, captures, tag_text)
        elif state is _S.VALUE and label == "closer":
            self._closing = [tag_text]
            self._state = _S.CLOSING
        elif state is _S.VALUE:
            self._end_unclosed_value(out, label, captures, tag_text)
        elif label == "open":  # a block opener in a block rejected as prose: the rejected text ends, a block starts
            self._open_block(out, tag_text)
        else:  # a rejected block or invocation ends
            self._raw_out(out, tag_text)
            self._state = _S.BLOCK if state is _S.REJECT_INVOKE else _S.CONTENT

    def _closing_step(self, out: list[Event], final: bool) -> bool:
        """After a value closer: whitespace is held; a tag that may follow a value ends the value
        (the tag is read in INVOKE); other text makes the closer value text."""
        rest = self._buf.lstrip()
        if len(rest) < len(self._buf):
            self._closing.append(self._buf[: len(self._buf) - len(rest)])
            self._buf = rest
            if not rest:
                return False
        safe, tag = self._sets[_S.INVOKE].find(rest, final)
        if safe == 0 and tag is not None:
            self._end_value(out)
        elif safe == 0:
            return False  # the start of a tag: wait for more text
        else:
            out.extend(self._call.value_text("".join(self._closing)))
            self._closing = []
            self._state = _S.VALUE
        return True

    def _end_value(self, out: list[Event]) -> None:
        out.extend(self._call.end_value())
        self._markup(out, "".join(self._closing))
        self._closing = []
        self._state = _S.INVOKE

    def _end_unclosed_value(self, out: list[Event], label: str, captures: tuple[str, ...], tag_text: str) -> None:
        """A wrap-led tag that may follow a value, inside a value: the value's closer was left out, so
        the value ends here and the tag (its wrap is markup) is read as it would be after the value."""
        out.append(ParseError(ParseErrorKind.MALFORMED_CALL, f"{self._call.name}.{self._key}: value not closed"))
        out.extend(self._call.end_value())
        self._state = _S.INVOKE
        self._call_tag(out, label, captures, tag_text)

    def _open_block(self, out: list[Event], tag_text: str) -> None:
        lead = ""  # wrapping before the opener: markup if a call starts, content if the block is raw
        if self._stray_mode is StrayText.ERROR:
            self._flush_stray(out)
        else:
            pending = self._take_pending()
            cut = len(pending) if self._after_block else strip_tail_len(pending, self._g.block_lead)
            if cut < len(pending):
                out.append(ContentDelta(pending[: len(pending) - cut]))
            lead = pending[len(pending) - cut :]
        self._after_block = False
        self._raw, self._block_calls = [lead, tag_text], 0
        self._state = _S.NAME if self._g.invoke_open is None else _S.BLOCK

    def _open_bare(self, out: list[Event], name: str, tag_text: str) -> None:
        """An invocation tag in answer text (`ToolGrammar.bare_invocations`): one at the start of a
        line (as the template writes a call) naming a call the output may make opens a block of its
        own, ended by the invocation closer; any other tag is answer text (prose naming
        ``<function=x>`` mid-line, or a tool it may not call, raises nothing and swallows nothing)."""
        if not self._at_line_start or self._invoke_error(name) is not None:
            self._answer_text(out, tag_text)
            return
        self._open_block(out, "")
        self._bare = True
        self._start_invoke(out, name, tag_text)

    def _block_opener(self, out: list[Event], tag_text: str) -> None:
        """A block opener inside an open block. Before the block's first invocation, the block so far
        is raw and a new block opens (prose naming the opener must not swallow the call after it);
        after a started call it is stray text."""
        if self._block_calls:
            self._stray.append(tag_text)
            return
        self._raw.append("".join(self._name))
        self._name = []
        self._reject_block(out, ParseError(ParseErrorKind.MALFORMED_CALL, "text before the first invocation"))
        self._open_block(out, tag_text)

    def _close_empty_or_block(self, out: list[Event], tag_text: str) -> None:
        if not self._block_calls:
            self._raw.append(tag_text)
            self._reject_block(out, ParseError(ParseErrorKind.MALFORMED_CALL, "block without invocations"))
            self._state = _S.CONTENT
            return
        self._flush_stray(out)
        self._markup(out, tag_text)
        self._end_block()

    def _end_block(self) -> None:
        self._state = _S.CONTENT
        self._after_block = True
        self._bare = False

    def _end_inline_name(self, out: list[Event], label: str, tag_text: str) -> None:
        name_text = "".join(self._name)
        self._name = []
        if label == "sep" and not name_text.strip():
            if tag_text.strip():  # a separator that is no whitespace starts the name's text, as it always did
                self._name = [name_text + tag_text]
                return
            # a whitespace separator before the name: block text before the invocation (kept out of
            # the name, so that a run of separators is not joined again at each one)
            self._raw.append(name_text + tag_text)
            return
        if label == "sep":
            name_text += tag_text
        else:  # the key or closer tag belongs to the invocation: scan it again there
            self._buf = tag_text + self._buf
        name = name_text.strip()
        # no tool's name holds whitespace: such a "name" is prose after an opener, so a block opener in
        # the rejected text may still open a block; a rejected name-shaped one is an invocation's
        self._start_invoke(out, name, name_text, _S.REJECT_PROSE if len(name.split()) > 1 else _S.REJECT_BLOCK)

    def _start_invoke(self, out: list[Event], name: str, tag_text: str, rejected: _S = _S.REJECT_BLOCK) -> None:
        """Starts the call ``name``, or rejects it: a block with no started call is raw up to its closer,
        in the state ``rejected`` (`REJECT_PROSE` where a block opener may end it, for a name that is
        no invocation's); otherwise the invocation is raw up to its closer."""
        g = self._g
        error = self._invoke_error(name)
        if error is not None:
            if not self._block_calls:
                self._raw.append(tag_text)
                self._reject_block(out, error, rejected)
            else:
                self._flush_stray(out)
                out.append(error)
                self._raw_out(out, tag_text)
                self._state = _S.REJECT_INVOKE if g.invoke_close else _S.REJECT_BLOCK
            return
        self._flush_stray(out)
        opening = "".join(self._raw) + tag_text
        self._raw = []
        index, call_id = self._ids.allocate()
        self._held = [MarkupDropped(opening), ToolCallStart(index, call_id, name)] if opening else \
            [ToolCallStart(index, call_id, name)]
        self._call_text = [opening, self._buf]  # the text after the tag is not consumed yet
        self._call = OpenCall(index, name, g.value_wrap, g.value_format)
        self._block_calls += 1
        self._num_calls += 1
        self._state = _S.INVOKE

    def _invoke_error(self, name: str) -> ParseError | None:
        """Why the invocation ``name`` cannot start a call (None when it can)."""
        if self._g.max_invocations and self._num_calls >= self._g.max_invocations:
            return ParseError(ParseErrorKind.EXTRA_INVOCATION, name)
        if not name:
            return ParseError(ParseErrorKind.MALFORMED_CALL, "empty invocation name")
        return self._names.check(name)

    def _call_tag(self, out: list[Event], label: str, captures: tuple[str, ...], tag_text: str) -> None:
        self._flush_stray(out)
        call = self._call
        if label == "value":
            self._markup(out, tag_text)
            out.extend(call.start_value(self._key, ValueMode.SCHEMA, self._names.registry.kinds(call.name, self._key)))
            self._state = _S.VALUE
        elif label == "key":
            if self._state is _S.KEY:
                out.append(ParseError(ParseErrorKind.MALFORMED_CALL, f"{call.name}.{self._key}: key without value"))
            self._markup(out, tag_text)
            self._key = captures[0].strip() if self._g.key_is_text else captures[0]
            if self._g.value_open:
                self._state = _S.KEY
                return
            out.extend(call.start_value(self._key, *self._value_mode(out, call.name, captures)))
            self._state = _S.VALUE
        else:  # "end": the invocation closer; "close": the block closer with the invocation open
            if self._state is _S.KEY:
                out.append(ParseError(ParseErrorKind.MALFORMED_CALL, f"{call.name}.{self._key}: key without value"))
            elif label == "close":
                out.append(ParseError(ParseErrorKind.MALFORMED_CALL, f"{call.name}: invocation not closed"))
            out.extend(call.end(True))
            self._call = None
            self._markup(out, tag_text)
            if self._g.invoke_close and label == "end" and not self._bare:
                self._state = _S.BLOCK
            else:
                self._end_block()

    def _value_mode(self, out: list[Event], name: str, captures: tuple[str, ...]):
        kinds = self._names.registry.kinds(name, captures[0])
        if self._g.string_flag is None:
            return ValueMode.SCHEMA, kinds
        flag = captures[1]
        if flag == self._g.string_flag[0]:
            return ValueMode.RAW_STRING, kinds
        if flag != self._g.string_flag[1]:
            out.append(ParseError(ParseErrorKind.MALFORMED_CALL, f"{name}.{captures[0]}: string flag {flag!r}"))
        return ValueMode.JSON, kinds

    # Output helpers.

    def _take_pending(self) -> str:
        pending, self._pending_ws = "".join(self._pending_ws), []
        return pending

    def _markup(self, out: list[Event], text: str) -> None:
        if text:
            out.append(MarkupDropped(text))

    def _raw_out(self, out: list[Event], text: str) -> None:
        if text:
            out.append(ContentDelta(text) if self._stray_mode is StrayText.CONTENT else MarkupDropped(text))

    def _reject_block(self, out: list[Event], error: ParseError, state: _S = _S.REJECT_BLOCK) -> None:
        """The block so far is raw, and so is the rest up to its closer. ``state`` is `REJECT_PROSE`
        where the block was rejected for text before its first invocation: a block opener in that
        text may open the real block; in a rejected invocation (`REJECT_BLOCK`) it is quoted text."""
        out.append(error)
        self._raw_out(out, "".join(self._raw))
        self._raw = []
        self._state = state

    def _flush_stray(self, out: list[Event]) -> None:
        text = "".join(self._stray)
        self._stray = []
        if text.strip():
            out.append(ParseError(ParseErrorKind.UNEXPECTED_TEXT, text))
        else:
            self._markup(out, text)

    def _finish_state(self, out: list[Event]) -> None:
        state = self._state
        if state is _S.CONTENT:
            pending = self._take_pending()
            if self._after_block or self._stray_mode is StrayText.ERROR:
                self._markup(out, pending)
            elif pending:
                out.append(ContentDelta(pending))
            self._flush_stray(out)
        elif state in (_S.BLOCK, _S.NAME) and not self._block_calls:
            out.append(ParseError(ParseErrorKind.UNTERMINATED_CALL, "output ended in a tool block"))
            text = "".join(self._raw) + "".join(self._name)
            if text:  # content in tool frames too, as the text of a call the output ends in
                out.append(ContentDelta(text))
            self._raw, self._name = [], []
        elif state is _S.BLOCK:
            self._flush_stray(out)
            out.append(ParseError(ParseErrorKind.UNTERMINATED_CALL, "tool block not closed"))
        elif state in (_S.INVOKE, _S.KEY, _S.VALUE):
            out.append(ParseError(ParseErrorKind.UNTERMINATED_CALL, self._call.name))
            text = "".join(self._call_text)
            if text:  # content in tool frames too: the text the output ended in is not lost
                out.append(ContentDelta(text))
            self._call, self._held, self._call_text, self._stray = None, [], [], []
        self._state = _S.CONTENT
        self._after_block = self._bare = False
