"""Structured output and tool forcing for recipient-header frames, as one llguidance grammar.

The grammar preserves the frames (`RecipientSyntax`); header controls are generated as their
tokens::

    frames  := pre* final
    pre     := START "assistant to=self" MESSAGE reasoning END_MESSAGE
             | START "assistant to=" VISIBLE MESSAGE text END_MESSAGE          (FREE answer only)
    final   := tool (END_MESSAGE tool)* END_MESSAGE?                           (one tool frame when single_call)
             | START "assistant to=" VISIBLE MESSAGE answer                    (unless the answer is NONE)
    tool    := START "assistant to=" (GENERIC | NAMED_PREFIX NAME) MESSAGE ws? atem-block ws?

- reasoning frames carry free text; the answer is one frame to a visible recipient (any of the
  syntax's ``content_recipients``), holding the ``response_format`` document (``@answer``,
  STRUCTURED) or free text (FREE), ended by EOS; visible frames before the final one are allowed
  only for a FREE answer, so a structured answer is the whole visible content;
- a tool frame holds one ATEM invocation: the generic recipient accepts any of the policy's tools,
  a named recipient exactly its tool (only the policy's tools are named);
- the output continues the prompt's position (`FrameStart`): at a boundary it starts a frame, in
  an open header it completes the header (only recipients whose header extends the rendered text),
  in an open body it continues that body.

Without tools (``policy`` None) only reasoning frames and the structured answer are allowed.
"""

from __future__ import annotations

from typing import Mapping

from helios.frontend.structured.grammar import GrammarError
from helios.frontend.structured.grammar_lark import LarkRules, Speller, free_text, json_literal, lark_of, text_then
from helios.frontend.structured.grammar_tools import ANSWER_RULE, AnswerKind, CallGrammar, CallPolicy, ToolSchema
from helios.frontend.parsers.atem import atem_grammar
from helios.frontend.parsers.start import FramePosition, FrameStart
from helios.frontend.decoding.syntax import RecipientSyntax


def _literal(text: str) -> str:
    return json_literal(text) if text else ""


def _seq(*parts: str) -> str:
    return " ".join(part for part in parts if part)


class FrameGrammar:
    """One build of a frames grammar; owns its `LarkRules`. Frame kinds: ``self`` (reasoning),
    ``note`` (visible text before the final frame), ``tool`` and ``answer`` (the final visible frame)."""

    def __init__(self, frames: RecipientSyntax, speller: Speller, policy: CallPolicy | None,
                 answer: AnswerKind, json_options: Mapping):
        if policy is None and answer is not AnswerKind.STRUCTURED:
            raise ValueError("a frames grammar without tools constrains a structured answer")
        self._f = frames
        self._policy = policy
        self._answer = policy.answer if policy is not None else answer
        self.rules = rules = LarkRules()
        controls = [speller(text) for text in (frames.start_control, frames.message_control, frames.end_message_control)]
        self._start, self._message, self._end = (lark_of(control) for control in controls)
        self._free = free_text(rules, controls)
        self._calls = CallGrammar(rules, atem_grammar(frames.tools), speller, json_options,
                                  forced=policy.forces_one_tool) if policy else None
        self._kinds = self._frame_kinds(text_then(rules, [controls[2]], avoid=controls[:2])[0])

    def lark(self, start: FrameStart) -> str:
        """The grammar text for an output starting at ``start``."""
        rules = self.rules
        frame = {kind: rules.rule(f"frame_{kind}", " | ".join(
            _seq(self._start, self._head(header, body)) for header, body in options))
            for kind, options in self._kinds.items() if options}
        tool_follow = self._tool_follow(frame.get("tool"))
        finals = [rules.rule("tools", f"{frame['tool']} {tool_follow}")] if "tool" in frame else []
        finals += [frame["answer"]] if "answer" in frame else []
        pre = " | ".join(frame[kind] for kind in ("self", "note") if kind in frame)
        sequence = rules.rule("frames", f"({pre})* ({' | '.join(finals)})")
        if start.position is FramePosition.BOUNDARY:
            return rules.text(sequence)
        follow = {"self": sequence, "note": sequence, "tool": tool_follow, "answer": ""}
        continuations = []
        for kind, options in self._kinds.items():
            for header, body in options:
                if start.position is FramePosition.BODY and header == self._header(start.recipient):
                    continuations.append(_seq(body, follow[kind]))
                elif start.position is FramePosition.HEADER and header.startswith(start.header_text):
                    rest = _literal(header[len(start.header_text):])
                    continuations.append(_seq(rest, self._message, body, follow[kind]))
        if not continuations:
            where = start.recipient or start.header_text
            raise GrammarError(f"the prompt's open frame {where!r} cannot continue under this request's constraints",
                               "messages")  # the rendered messages left it open
        return rules.text(" | ".join(continuations))

    def _head(self, header: str, body: str) -> str:
        return _seq(_literal(header), self._message, body)

    def _header(self, recipient: str) -> str:
        return self._f.role + self._f.recipient_prefix + recipient

    def _frame_kinds(self, reasoning: str) -> dict[str, list[tuple[str, str]]]:
        """Frame kind -> (header text, body rule) options this request allows."""
        f, rules = self._f, self.rules
        visible = [self._header(recipient) for recipient in f.content_recipients]
        kinds: dict[str, list[tuple[str, str]]] = {"self": [(self._header(f.reasoning_recipient), reasoning)]}
        if self._answer is AnswerKind.FREE:
            note = rules.rule("note", f"{self._free}? {self._end}")
            kinds["note"] = [(header, note) for header in visible]
            kinds["answer"] = [(header, f"{self._free}?") for header in visible]
        elif self._answer is AnswerKind.STRUCTURED:
            kinds["answer"] = [(header, ANSWER_RULE) for header in visible]
        if self._policy is not None:
            tools = self._policy.tools
            kinds["tool"] = [(self._header(f.generic_tool_recipient), self._tool_body(tools))]
            kinds["tool"] += [(self._header(f.named_tool_prefix + tool.name), self._tool_body((tool,))) for tool in tools]
        return kinds

    def _tool_body(self, tools: tuple[ToolSchema, ...]) -> str:
        calls = self._calls
        ws = calls.ws
        return self.rules.rule(
            "tool_body", f"{ws}? {lark_of(calls.opener())} {ws}? {calls.invocations(tools)} {ws}? {calls.closer()} {ws}?"
        )

    def _tool_follow(self, tool_frame: str | None) -> str:
        """What may follow a tool frame's body: more tool frames unless single_call, then the end."""
        if tool_frame is None or self._policy.single_call:
            return f"{self._end}?"
        return self.rules.rule("more_tools", f"({self._end} {tool_frame})* {self._end}?")


def frames_lark(frames: RecipientSyntax, speller: Speller, start: FrameStart, policy: CallPolicy | None,
                answer: AnswerKind, json_options: Mapping) -> str:
    """The top-level Lark grammar for recipient frames (referencing ``@answer`` when STRUCTURED)."""
    return FrameGrammar(frames, speller, policy, answer, json_options).lark(start)
