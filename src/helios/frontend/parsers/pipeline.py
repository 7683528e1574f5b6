"""OutputPipeline: one reasoning parser and one tool parser, chosen by independent selectors.

The reasoning parser reads generated text first; the answer text it emits (`ContentDelta`) is what
the tool parser reads. The recipient-header pair and the harmony channel pair are each one parser,
since they consume whole frames.
`OutputPipeline.create` wires the parsers from validated `OutputSyntax` (pairings are checked when
that is constructed), the tokenizer's single-token delimiters, and the request's `OutputRequest`.

Feeding contract (`delimiters`): ``feed(token_id, text)`` with the text of one or more consecutive
generated tokens ending with ``token_id``; a registered delimiter token always ends its feed; EOS
and stop tokens withheld from presentation are not fed. The events are the same in total for any
such chunking, and `result()` after `finish()` is identical for all of them.

`num_reasoning_tokens` counts the generated tokens that were reasoning (usage's
``completion_tokens_details.reasoning_tokens``), read from what the reasoning parser emits for each
feed (one token's text a feed, as `helios.frontend.responses.output` feeds it; a token without
text yet, the start of a character a later token completes, is fed ``""``): a token counts when
its feed emitted only reasoning text, and a token whose feed emitted nothing (text the parser
holds: a newline that may be the close delimiter's wrapping, the start of an entity or of a
delimiter spelled in text) counts when the next feed that emits anything emits reasoning text
first, or, at the end, when the output was still reasoning. So the reasoning delimiters (a repeated
open delimiter inside reasoning included), harmony headers and controls, and the answer are not
counted; the tokens between the delimiters are, as vLLM counts them, but for a token whose whole
text the parser held right before a delimiter (a lone newline before ``</think>``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from helios.errors import ContractError
from helios.frontend.decoding.events import ContentDelta, Event, ParseResult, ReasoningDelta, ResultBuilder
from helios.frontend.parsers.calls import CallIds
from helios.frontend.parsers.delimiters import TokenDelimiters
from helios.frontend.parsers.dsml import dsml_grammar
from helios.frontend.parsers.glm_arguments import glm_arguments_grammar
from helios.frontend.parsers.harmony import HarmonyParser
from helios.frontend.parsers.json_calls import JsonCallParser
from helios.frontend.parsers.qwen_coder import qwen_coder_grammar
from helios.frontend.parsers.recipient_frames import RecipientFrameParser
from helios.frontend.parsers.start import AnswerMode, OutputStart, ReasoningState
from helios.frontend.parsers.tool_grammar import NameRule, ToolGrammar
from helios.frontend.parsers.tag_tools import TagToolParser
from helios.frontend.parsers.think_tags import ThinkTagParser
from helios.frontend.parsers.values import ToolRegistry
from helios.frontend.parsers.xtml import xtml_grammar
from helios.frontend.decoding.syntax import OutputSyntax, ReasoningSyntaxKind, ToolSyntaxKind


class OutputParser(Protocol):
    def feed(self, token_id: int, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


class PlainText:
    """The NONE reasoning parser: every text is answer text."""

    def feed(self, token_id: int, text: str) -> list[Event]:
        return [ContentDelta(text)] if text else []

    def finish(self) -> list[Event]:
        return []


@dataclass(frozen=True)
class OutputRequest:
    """Per-request parser inputs: registered tools, the call-id prefix (unique per request), the
    initial state from the prompt path, the answer mode and the length of random call ids (the
    contract's ``tool_call_id_len``; 0: ids are the prefix and the call's index)."""

    tools: ToolRegistry
    call_id_prefix: str
    start: OutputStart = field(default_factory=OutputStart)
    answer: AnswerMode = AnswerMode.FREE
    call_id_len: int = 0


_GRAMMARS = {
    ToolSyntaxKind.QWEN_CODER_FUNCTIONS: qwen_coder_grammar,
    ToolSyntaxKind.GLM_ARGUMENTS: glm_arguments_grammar,
    ToolSyntaxKind.DSML: dsml_grammar,
    ToolSyntaxKind.XTML: xtml_grammar,
}


def tool_grammar(syntax: OutputSyntax) -> ToolGrammar | None:
    build = _GRAMMARS.get(syntax.tool_kind)
    return build(syntax.tools) if build is not None else None


class ReasoningCount:
    """Generated tokens that were reasoning, from the reasoning parser's events of each feed (see the
    module docstring). Owned by one `OutputPipeline`."""

    def __init__(self, reasoning_open: bool = False) -> None:
        self.num_tokens = 0
        self._num_held = 0  # tokens fed since the last feed that emitted anything
        # that feed emitted only reasoning text; before any, whether the prompt opened reasoning (an
        # output of held text alone, a newline cut by the limit, was reasoning then)
        self._is_reasoning = reasoning_open

    def add(self, events: list[Event], is_token: bool) -> None:
        """One feed's events (`is_token`: the feed is a generated token's, not text flushed at the end)."""
        if not events:
            self._num_held += is_token
            return
        if isinstance(events[0], ReasoningDelta):  # the held tokens' text came out as reasoning
            self.num_tokens += self._num_held
        self._num_held = 0
        self._is_reasoning = all(isinstance(event, ReasoningDelta) for event in events)
        self.num_tokens += is_token and self._is_reasoning

    def finish(self, events: list[Event]) -> None:
        """The parser's last events: held tokens count when reasoning is still open."""
        if events:
            self.add(events, is_token=False)
        elif self._is_reasoning:
            self.num_tokens += self._num_held
        self._num_held = 0


class OutputPipeline:
    """Runs ``first`` (reasoning) and feeds its answer text to ``second`` (tools, optional).

    One pipeline serves one request's output, driven by one thread. It owns both parsers and a
    `ResultBuilder`; `result()` is the summary of every event returned so far.
    """

    def __init__(self, first: OutputParser, second: OutputParser | None = None, reasoning_open: bool = False):
        self._first = first
        self._second = second
        self._builder = ResultBuilder()
        self._reasoning = ReasoningCount(reasoning_open)
        self._finished = False

    @classmethod
    def create(cls, syntax: OutputSyntax, delimiters: TokenDelimiters, request: OutputRequest) -> "OutputPipeline":
        ids = CallIds(request.call_id_prefix, request.call_id_len)
        if syntax.frames is not None:
            for name in ("start_control", "message_control", "end_message_control"):
                if not delimiters.is_single_token(getattr(syntax.frames, name)):
                    raise ContractError(f"frontend.frames.{name}", "header control is not a single tokenizer token")
            frames = RecipientFrameParser(syntax.frames, delimiters, request.start.frame, request.tools, ids)
            return cls(frames)
        if syntax.channels is not None:
            for control in syntax.channels.controls:
                if not delimiters.is_single_token(control):
                    raise ContractError("frontend.channel_syntax", f"control {control!r} is not a single tokenizer token")
            return cls(HarmonyParser(syntax.channels, delimiters, request.start.frame, request.tools, ids))
        if syntax.reasoning_kind is ReasoningSyntaxKind.NONE:
            first: OutputParser = PlainText()
        else:
            escaped = syntax.reasoning_kind is ReasoningSyntaxKind.XTML_THINK
            start = request.start
            first = ThinkTagParser(syntax.think, delimiters, start.reasoning, escaped, start.answer_lead)
        grammar = tool_grammar(syntax)
        second = None
        if syntax.tool_kind is ToolSyntaxKind.JSON_CALLS:
            second = JsonCallParser(syntax.tools, NameRule(request.tools), ids, answer=request.answer)
        elif grammar is not None:
            second = TagToolParser(grammar, NameRule(request.tools), ids, answer=request.answer)
        return cls(first, second, reasoning_open=request.start.reasoning is ReasoningState.OPEN)

    def feed(self, token_id: int, text: str) -> list[Event]:
        """`text` ends with generated token `token_id` (a negative id: text no one token ends, flushed
        at the end or cut by a stop); a token may come without text (the start of a character)."""
        if self._finished:
            raise ValueError("feed after finish")
        events = self._first.feed(token_id, text)
        self._reasoning.add(events, token_id >= 0)
        return self._route(token_id, events, finishing=False)

    def finish(self) -> list[Event]:
        if self._finished:
            return []
        self._finished = True
        events = self._first.finish()
        self._reasoning.finish(events)
        return self._route(-1, events, finishing=True)

    def result(self) -> ParseResult:
        return self._builder.result()

    @property
    def num_reasoning_tokens(self) -> int:
        """Generated tokens fed so far that were reasoning (final after `finish`; see the module docstring)."""
        return self._reasoning.num_tokens

    def _route(self, token_id: int, events: list[Event], finishing: bool) -> list[Event]:
        if self._second is not None:
            routed: list[Event] = []
            for event in events:
                if isinstance(event, ContentDelta):
                    routed.extend(self._second.feed(token_id, event.text))
                else:
                    routed.append(event)
            if finishing:
                routed.extend(self._second.finish())
            events = routed
        self._builder.apply(events)
        return events
