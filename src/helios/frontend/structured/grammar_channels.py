"""Structured output and tool forcing for harmony channel frames, as one llguidance grammar.

The grammar keeps the frames (`ChannelSyntax`); controls are generated as their tokens::

    frames    := (reasoning START)* final                 (at most one reasoning frame with a budget)
    reasoning := ROLE CHANNEL reasoning_channel MESSAGE text[max_tokens=budget] END
    final     := ROLE CHANNEL final_channel MESSAGE answer                   (unless the answer is NONE)
               | ROLE CHANNEL tool_channel " " MARKER NAMESPACE NAME " " CONSTRAIN type MESSAGE arguments

- the answer is the ``response_format`` document (``@answer``, STRUCTURED) or free text (FREE),
  ended by EOS (the return control); a structured answer is the whole visible content;
- a call is one tool frame (its call control is an EOS token, so one call ends the output:
  harmony writes parallel calls one turn at a time), with compact JSON arguments typed by the
  tool's schema (`grammar_json_calls.arguments_schema`);
- reasoning frames carry free text; with a budget (half the request's output limit) there is at
  most one, of at most ``budget`` tokens, so a sampled model always reaches the answer or the call;
- the output continues the prompt's position (`FrameStart`): at a boundary it starts a frame; in an
  open header it completes the header when the rendered text is a prefix of the role; in an open
  body (an assistant prefill, ``continue_final_message``) it continues the body as the grammar would
  have begun it: a reasoning body's text, then the frames; the final channel's body, the answer (a
  structured one begins after the prefilled text, as a tag syntax's does), or with no answer allowed
  (a forced call) the body ends and the call's frame follows. A tool body, whose JSON arguments
  the grammar would have to take up mid-value, or any other body cannot be continued (`GrammarError`).

Without tools (``policy`` None) only reasoning frames and the structured answer are allowed.
"""

from __future__ import annotations

from typing import Mapping

from helios.frontend.structured.grammar import GrammarError
from helios.frontend.structured.grammar_json_calls import arguments_schema
from helios.frontend.structured.grammar_lark import LarkRules, Speller, free_text, json_literal, lark_of
from helios.frontend.structured.grammar_tools import ANSWER_RULE, AnswerKind, CallPolicy
from helios.frontend.parsers.harmony import parse_header
from helios.frontend.parsers.start import FramePosition, FrameStart
from helios.frontend.decoding.syntax import ChannelSyntax


def channels_lark(channels: ChannelSyntax, speller: Speller, start: FrameStart, policy: CallPolicy | None,
                  answer: AnswerKind, json_options: Mapping, budget: int | None = None) -> str:
    """The top-level Lark grammar for harmony frames (referencing ``@answer`` when STRUCTURED)."""
    answer = policy.answer if policy is not None else answer
    if policy is None and answer is not AnswerKind.STRUCTURED:
        raise ValueError("a channels grammar without tools constrains a structured answer")
    rules = LarkRules()
    controls = [speller(text) for text in channels.controls]
    start_control, channel, message, end = (lark_of(speller(text)) for text in (
        channels.start_control, channels.channel_control, channels.message_control, channels.end_control))
    constrain = lark_of(speller(channels.constrain_control))
    free = free_text(rules, controls)
    bounded = f"max_tokens={budget}" if budget is not None else ""
    text = rules.rule("reasoning_text", f"{free}?", bounded)
    reasoning = rules.rule("reasoning", " | ".join(
        f"{channel} {json_literal(name)} {message} {text} {end} {start_control}" for name in channels.reasoning_channels))
    finals = []
    if answer is AnswerKind.STRUCTURED:
        finals.append(f"{channel} {json_literal(channels.final_channel)} {message} {ANSWER_RULE}")
    elif answer is AnswerKind.FREE:
        finals.append(f"{channel} {json_literal(channels.final_channel)} {message} {free}?")
    for i, tool in enumerate(policy.tools if policy is not None else ()):
        arguments = rules.rule(f"args_{i}", f"%json {arguments_schema(tool, json_options)}")
        recipient = f"{channels.tool_channel} {channels.recipient_marker}{channels.tool_namespace}{tool.name} "
        finals.append(f"{channel} {json_literal(recipient)} {constrain} {json_literal(channels.tool_content_type)} "
                      f"{message} {arguments}")
    final = rules.rule("final", " | ".join(finals))
    role = json_literal(channels.role)
    repeat = "?" if budget is not None else "*"  # a bounded section is one reasoning frame
    frames = rules.rule("frames", f"({role} {reasoning}){repeat} {role} {final}")
    if start.position is FramePosition.BOUNDARY:
        return rules.text(f"{start_control} {frames}")
    then = f"{role} {final}" if budget is not None else frames  # after a reasoning frame
    if start.position is FramePosition.HEADER and channels.role.startswith(start.header_text):
        rest = channels.role[len(start.header_text):]
        first = f"{json_literal(rest)} " if rest else ""
        return rules.text(f"{first}{final} | {first}{reasoning} {then}")
    if start.position is FramePosition.BODY:
        header = parse_header(channels, start.recipient)
        if header.role == channels.role and not header.recipient:
            if header.channel in channels.reasoning_channels:
                return rules.text(f"{text} {end} {start_control} {then}")
            if header.channel == channels.final_channel:
                if answer is AnswerKind.STRUCTURED:
                    return rules.text(ANSWER_RULE)
                if answer is AnswerKind.FREE:
                    return rules.text(f"{free}?")
                return rules.text(f"{end} {start_control} {frames}")  # the forced call's frame follows
    where = start.recipient or start.header_text
    raise GrammarError(f"the prompt's open frame {where!r} cannot continue under this request's constraints",
                       "messages")  # the rendered messages left it open
