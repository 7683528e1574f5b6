"""Delimited reasoning: think tags (`ReasoningSyntaxKind.THINK_TAGS`) and the XTML think element.

    [<think>\\n] REASONING [\\n</think>\\n\\n] ANSWER

Delimiter rules (from the serving contract):

- a delimiter that the tokenizer encodes as one token (`TokenDelimiters`) delimits only when
  generated as that token; the same spelling generated as plain text pieces stays text. A
  delimiter that is several tokens is recognised in the text;
- the close delimiter ends reasoning once; a later close (or open) delimiter token is protocol
  markup, dropped (`MarkupDropped`), never answer text;
- the initial state comes from the prompt path: OPEN starts inside reasoning; UNOPENED (and
  NO_REASONING) lets the output open reasoning once, with the open delimiter before any answer text
  (leading whitespace is then dropped); CLOSED starts in the answer, where delimiter tokens are
  protocol markup, and the ``after_close`` wrapping the prompt has not written (``answer_lead``) is
  removed from the answer's start where present;
- the terminal marker (the tool syntax's opener) also ends reasoning, and is passed on as answer
  text so the tool parser sees its block open;
- wrapping text (``after_open``, ``before_close``, ``after_close``) is removed where present.

The answer is emitted as `ContentDelta`; `OutputPipeline` passes it to the tool parser. The XTML
variant differs only in that reasoning text is XML-escaped and is decoded here (`xtml`).
"""

from __future__ import annotations

import enum

from helios.frontend.decoding.events import ContentDelta, Event, MarkupDropped, ReasoningDelta
from helios.frontend.parsers.delimiters import TokenDelimiters, split_feed
from helios.frontend.parsers.scan import TagSet, TagForm
from helios.frontend.parsers.start import ReasoningState
from helios.frontend.parsers.text import WrappedText, XmlEntityDecoder
from helios.frontend.decoding.syntax import ThinkSyntax


class _S(enum.Enum):
    BEFORE = 1  # reasoning may still open
    REASONING = 2
    ANSWER = 3


class ThinkTagParser:
    """Splits one output into reasoning and answer text. Driven by one thread; owns its state.

    ``escaped`` reasoning text is XML-escaped and is decoded before it is emitted.
    """

    def __init__(self, syntax: ThinkSyntax, delimiters: TokenDelimiters, start: ReasoningState,
                 escaped: bool = False, answer_lead: str = ""):
        self._syntax = syntax
        self._delimiters = delimiters
        self._escaped = escaped
        in_text = {
            label: TagForm(spelling)
            for label, spelling in (("close", syntax.close), ("terminal", syntax.terminal))
            if spelling and not delimiters.is_single_token(spelling)
        }
        self._reasoning_tags = TagSet(in_text) if in_text else None
        self._open_in_text = not delimiters.is_single_token(syntax.open)
        self._buf = ""
        # While reasoning may open: the leading whitespace, moved out of `_buf` as it arrives and
        # joined once decided, so a long run of it is not scanned again on every feed.
        self._lead_ws: list[str] = []
        self._state = _S.BEFORE
        self._reasoning = WrappedText()
        self._answer = WrappedText()
        if start is ReasoningState.OPEN:
            self._open_reasoning()
        elif start is ReasoningState.CLOSED:
            self._state = _S.ANSWER
            self._answer = WrappedText(answer_lead)

    def feed(self, token_id: int, text: str) -> list[Event]:
        before, delimiter, markup = split_feed(self._delimiters, token_id, text)
        out: list[Event] = []
        self._buf += before
        self._run(out, final=delimiter is not None)
        if delimiter is not None:
            self._delimiter_token(out, delimiter, markup)
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._run(out, final=True)
        if self._state is _S.BEFORE:
            self._answer_text(out, self._take_lead_ws() + self._buf)
        elif self._state is _S.REASONING:
            self._emit_reasoning(out, self._reasoning.close())
        else:
            self._emit_answer(out, self._answer.close())
        self._buf = ""
        return out

    def _open_reasoning(self) -> None:
        decoder = XmlEntityDecoder() if self._escaped else None
        self._reasoning = WrappedText(self._syntax.after_open, self._syntax.before_close, decoder)
        self._state = _S.REASONING

    def _end_reasoning(self, out: list[Event], answer_lead: str) -> None:
        self._emit_reasoning(out, self._reasoning.close())
        self._answer = WrappedText(answer_lead)
        self._state = _S.ANSWER

    def _run(self, out: list[Event], final: bool) -> None:
        if self._state is _S.BEFORE:
            self._before(out, final)
        if self._state is _S.REASONING:
            self._in_reasoning(out, final)
        if self._state is _S.ANSWER and self._buf:
            self._answer_text(out, self._buf)
            self._buf = ""

    def _before(self, out: list[Event], final: bool) -> None:
        """Leading whitespace waits (in `_lead_ws`): it is dropped if reasoning opens, answer text
        otherwise."""
        rest = self._buf.lstrip()
        if len(rest) < len(self._buf):
            self._lead_ws.append(self._buf[: len(self._buf) - len(rest)])
            self._buf = rest
        if not rest:
            return
        opener = self._syntax.open
        if self._open_in_text:
            if rest.startswith(opener):
                self._markup(out, self._take_lead_ws() + opener)
                self._buf = rest[len(opener) :]
                self._open_reasoning()
                return
            if opener.startswith(rest) and not final:
                return
        self._buf = self._take_lead_ws() + self._buf
        self._state = _S.ANSWER
        self._answer = WrappedText()

    def _take_lead_ws(self) -> str:
        lead, self._lead_ws = "".join(self._lead_ws), []
        return lead

    def _in_reasoning(self, out: list[Event], final: bool) -> None:
        while self._buf:
            if self._reasoning_tags is None:
                safe, tag = len(self._buf), None
            else:
                safe, tag = self._reasoning_tags.find(self._buf, final)
            self._emit_reasoning(out, self._reasoning.push(self._buf[:safe]))
            if tag is None:
                self._buf = self._buf[safe:]
                return
            tag_text, self._buf = self._buf[tag.start : tag.end], self._buf[tag.end :]
            if tag.label == "close":
                self._markup(out, tag_text)
                self._end_reasoning(out, self._syntax.after_close)
            else:
                self._end_reasoning(out, "")
                self._answer_text(out, tag_text)
            return

    def _delimiter_token(self, out: list[Event], delimiter: str, markup: str) -> None:
        syntax, state = self._syntax, self._state
        if delimiter == syntax.terminal:
            if state is _S.REASONING:
                self._end_reasoning(out, "")
            elif state is _S.BEFORE:
                self._to_answer(out)
            self._answer_text(out, delimiter)
        elif delimiter == syntax.open and state is _S.BEFORE:
            self._markup(out, self._take_lead_ws() + self._buf + markup)
            self._buf = ""
            self._open_reasoning()
        elif delimiter == syntax.close and state is not _S.ANSWER:
            if state is _S.BEFORE:
                self._to_answer(out)
            self._markup(out, markup)
            self._end_reasoning(out, syntax.after_close)
        else:  # an open delimiter inside reasoning or the answer, a repeated close: protocol markup
            self._markup(out, markup)

    def _to_answer(self, out: list[Event]) -> None:
        self._state = _S.ANSWER
        self._answer = WrappedText()
        self._answer_text(out, self._take_lead_ws() + self._buf)
        self._buf = ""

    def _answer_text(self, out: list[Event], text: str) -> None:
        self._emit_answer(out, self._answer.push(text))

    @staticmethod
    def _emit_reasoning(out: list[Event], text: str) -> None:
        if text:
            out.append(ReasoningDelta(text))

    @staticmethod
    def _emit_answer(out: list[Event], text: str) -> None:
        if text:
            out.append(ContentDelta(text))

    @staticmethod
    def _markup(out: list[Event], text: str) -> None:
        if text:
            out.append(MarkupDropped(text))
