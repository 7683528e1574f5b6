"""What the runtime needs from a chat template, read by rendering probe conversations.

- `message_boundary`: the generation prompt (what ``add_generation_prompt`` appends), the assistant
  header (the text every assistant turn starts with, in history and in the generation prompt),
  split into the part every message starts with (`message_start`) and the assistant role's own part,
  and the message end (what follows an assistant message; for templates that end a message only by
  starting the next one, the next message's opening).
- `reasoning_facts`: whether the template itself renders think tags (in a generation prompt, with or
  without an ``enable_thinking``/``thinking`` switch, or around an assistant message's
  ``reasoning_content``), and the wrapping it renders around them.
- `tool_call_text`: how an assistant message with one tool call renders (the family's markup).
- `tool_call_id_len`: the length of the random alphanumeric call ids the template requires, where it
  refuses ids of the server's default form (Mistral's: nine alphanumerics).
- `prefix_rules`: per role, the strongest prefix constraint under which every shorter probe
  conversation's stable part renders as a prefix of every longer one.

Every derived fact is checked against the renders; a template that cannot be analysed raises
`CheckpointError` naming what is missing and the ``--frontend`` key that states it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from tokenizers import Tokenizer

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.frontend.render import RENDER_FAILURES, ProbeTemplate

SYSTEM, USER1, USER2, USER3 = "Probe system text.", "Probe question one?", "Probe question two?", "Probe three?"
ANSWER1, ANSWER2, REASONING = "Probe answer one.", "Probe answer two.", "Probe reasoning text."
TOOL_NAME, TOOL_KEY, TOOL_VALUE, TOOL_RESULT = "probe_lookup", "probe_key", "probe value", "Probe result."
CALL_ID = "probe0001"  # nine alphanumerics: Mistral templates insist
# A call id of the server's default form, `call_<request id>_<index>` (helios.frontend.session).
DEFAULT_FORM_CALL_ID = "call_0123456789abcdef0123456789abcdef_0"
PROBE_TOOLS = [{"type": "function", "function": {
    "name": TOOL_NAME, "description": "Probe tool.",
    "parameters": {"type": "object", "properties": {TOOL_KEY: {"type": "string"}}, "required": [TOOL_KEY]},
}}]
THINK_TAGS = (("<think>", "</think>"),)
THINKING_ON = {"enable_thinking": True, "thinking": True}
THINKING_OFF = {"enable_thinking": False, "thinking": False}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str, reasoning: str | None = None) -> dict:
    message = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def tool_call_message(arguments_as_text: bool = False, call_id: str = CALL_ID) -> dict:
    arguments = {TOOL_KEY: TOOL_VALUE}
    if arguments_as_text:
        arguments = '{"%s": "%s"}' % (TOOL_KEY, TOOL_VALUE)
    call = {"id": call_id, "type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def tool_result(call_id: str = CALL_ID) -> dict:
    return {"role": "tool", "content": TOOL_RESULT, "tool_call_id": call_id, "name": TOOL_NAME}


@dataclass(frozen=True)
class Boundary:
    message_start: str
    assistant_header: str
    message_end: str
    generation_prompt: str


def _render(template: ProbeTemplate, what: str, messages: list[dict], **options) -> str:
    try:
        return template.render(messages, **options)
    except RENDER_FAILURES as error:
        raise CheckpointError(f"the chat template cannot render {what}: {type(error).__name__}: {error}") from None


def common_token_prefix(tokenizer: Tokenizer, a: str, b: str) -> str:
    """The longest common prefix of `a` and `b` that ends on a token boundary of both."""
    ea, eb = tokenizer.encode(a, add_special_tokens=False), tokenizer.encode(b, add_special_tokens=False)
    n = 0
    while n < min(len(ea.ids), len(eb.ids)) and ea.ids[n] == eb.ids[n]:
        n += 1
    if n == 0:
        return ""
    end = ea.offsets[n - 1][1]
    return a[:end] if a[:end] == b[:end] else ""


def message_boundary(template: ProbeTemplate, tokenizer: Tokenizer, stated: dict[str, str]) -> Boundary:
    """The assistant boundary (see the module docstring); `stated` values win over derived ones."""
    first = _render(template, "a single user message", [user(USER1)])
    prompted = _render(template, "a generation prompt", [user(USER1)], add_generation_prompt=True)
    if not prompted.startswith(first):
        raise CheckpointError("the chat template's add_generation_prompt rewrites the conversation instead of "
                              "appending a generation prompt to it")
    generation = prompted[len(first):]
    answered = _render(template, "an assistant reply", [user(USER1), assistant(ANSWER1)])
    if not answered.startswith(first) or ANSWER1 not in answered[len(first):]:
        raise CheckpointError("the chat template does not render an assistant reply after the user message")
    opening, _, ending = answered[len(first):].partition(ANSWER1)
    follow = _render(template, "a second user turn", [user(USER1), assistant(ANSWER1), user(USER2)])
    between = follow.partition(USER2)[0]
    between = between[between.rfind(ANSWER1) + len(ANSWER1):] if ANSWER1 in between else ""
    next_open = between[len(ending):] if ending and between.startswith(ending) else between
    message_end = stated.get("message_end") or ending.strip() or next_open.strip()
    if not message_end:
        raise CheckpointError("cannot find the chat template's message end: nothing follows an assistant "
                              "message; state it with --frontend message_end=TEXT")
    header = stated.get("assistant_header") or _assistant_header(tokenizer, opening, generation, first)
    if not header:
        raise CheckpointError("cannot find where the chat template starts an assistant turn (no generation "
                              "prompt and nothing after a user message); state it with --frontend assistant_header=TEXT")
    start = stated.get("message_start")
    if start is None:
        start = common_token_prefix(tokenizer, header, next_open.lstrip()) if next_open.strip() else ""
        if not _is_control_text(tokenizer, start):
            start = ""  # shared plain text ("[" of "[A]" and "[U]") is no message start
    if not header.startswith(start) or header == start:
        raise CheckpointError(f"message_start {start!r} must be a proper prefix of the assistant header {header!r}")
    if header not in prompted:
        raise CheckpointError(f"the assistant header {header!r} is not in the rendered generation prompt")
    return Boundary(start, header[len(start):], message_end, generation)


def _is_control_text(tokenizer: Tokenizer, text: str) -> bool:
    """Whether `text` is made of the tokenizer's added (control) tokens only."""
    added = tokenizer.get_added_tokens_decoder()
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return bool(ids) and all(i in added for i in ids)


def _assistant_header(tokenizer: Tokenizer, opening: str, generation: str, first: str) -> str:
    header = _header_text(tokenizer, opening, generation, first)
    for tags in THINK_TAGS:  # reasoning delimiters belong to the envelope, not to its header
        for tag in tags:
            if header.find(tag) > 0:
                header = header[: header.find(tag)]
    return header


def _header_text(tokenizer: Tokenizer, opening: str, generation: str, first: str) -> str:
    if generation.strip():
        if opening.strip():
            shared = common_token_prefix(tokenizer, generation, opening)
            if shared.strip():
                return shared
        return generation
    # No generation prompt ([INST] styles): the assistant turn starts after the user message's tail.
    return first.partition(USER1)[2].strip()


@dataclass(frozen=True)
class ReasoningFacts:
    open: str
    close: str
    wrapping_newlines: int
    after_close: str


def reasoning_facts(template: ProbeTemplate, generation_prompt: str) -> ReasoningFacts | None:
    """Think tags the template itself renders, or None (a tokenizer token alone decides nothing)."""
    prompts = [generation_prompt]
    for switch in (THINKING_ON, THINKING_OFF):
        text = template.try_render([user(USER1)], add_generation_prompt=True, **switch)
        prompts.append(text or "")
    history = template.try_render([user(USER1), assistant(ANSWER1, REASONING)]) or ""
    tail = history.partition(USER1)[2]
    for open_tag, close_tag in THINK_TAGS:
        if not any(open_tag in p or close_tag in p for p in prompts) and close_tag not in tail:
            continue
        wrap, after = 0, ""
        inner = tail.partition(open_tag)[2]
        if REASONING in inner and close_tag in inner:
            before_text, _, rest = inner.partition(REASONING)
            wrap = len(before_text) - len(before_text.lstrip("\n"))
            after = rest.partition(close_tag)[2].partition(ANSWER1)[0]
            after = after if not after.strip() else ""
        return ReasoningFacts(open_tag, close_tag, wrap, after)
    return None


def tool_call_text(template: ProbeTemplate) -> str:
    """How the template renders an assistant tool call after the user message ("" when it renders
    none: the template has no tool calls)."""
    for as_text in (False, True):
        for tools in (PROBE_TOOLS, None):
            messages = [user(USER1), tool_call_message(as_text)]
            text = template.try_render(messages, tools=tools)
            if text and USER1 in text:
                region = text[text.rfind(USER1) + len(USER1):]
                if TOOL_NAME in region:
                    return region
    return ""


def tool_call_id_len(template: ProbeTemplate) -> int:
    """The length of the random alphanumeric ids the server must give tool calls so that a client
    can send them back as history: 0 when the template renders a call and its result under an id of
    the server's default form (or renders no call under either id), else the length of the probe's
    alphanumeric id where that renders (Mistral's templates refuse any other: "Tool call IDs should
    be alphanumeric strings with length 9!")."""
    if _renders_call(template, DEFAULT_FORM_CALL_ID) or not _renders_call(template, CALL_ID):
        return 0
    return len(CALL_ID)


def _renders_call(template: ProbeTemplate, call_id: str) -> bool:
    """Whether a tool call under `call_id` and its result render after the user message."""
    for as_text, tools in itertools.product((False, True), (PROBE_TOOLS, None)):
        messages = [user(USER1), tool_call_message(as_text, call_id), tool_result(call_id)]
        if template.try_render(messages, tools=tools) is not None:
            return True
    return False


def _conversation(template: ProbeTemplate, has_tools: bool, arguments_as_text: bool) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}, user(USER1)]
    if has_tools:
        messages += [tool_call_message(arguments_as_text), tool_result()]
    messages += [assistant(ANSWER1, REASONING), user(USER2), assistant(ANSWER2, REASONING), user(USER3)]
    if template.try_render(messages[:1]) is None:
        messages = messages[1:]
    return messages


_ROLES = {"system": spb.MESSAGE_ROLE_SYSTEM, "user": spb.MESSAGE_ROLE_USER,
          "assistant": spb.MESSAGE_ROLE_ASSISTANT, "tool": spb.MESSAGE_ROLE_TOOL}
_STRENGTH = (spb.PREFIX_CONSTRAINT_STABLE, spb.PREFIX_CONSTRAINT_CHANGES_WHEN_LAST,
             spb.PREFIX_CONSTRAINT_CHANGES_AFTER_USER_TURN)


def stable_count(roles: Sequence[str], rules: dict[str, int]) -> int:
    """Leading messages the runtime treats as stable under `rules` (helios.frontend.preparation.prompt's rule)."""
    for i, role in enumerate(roles):
        constraint = rules.get(role)
        is_last = i == len(roles) - 1
        later_user = "user" in roles[i + 1:]
        if (constraint is None or (constraint == spb.PREFIX_CONSTRAINT_CHANGES_WHEN_LAST and is_last)
                or (constraint == spb.PREFIX_CONSTRAINT_CHANGES_AFTER_USER_TURN and not later_user)):
            return i
    return len(roles)


def prefix_rules(template: ProbeTemplate, has_tools: bool) -> list[spb.PrefixBoundaryRule]:
    """Per-role constraints that hold on the probe conversations, strongest first; [] when the
    template cannot render them (every role is then accepted and no prefix is declared stable)."""
    for tools, as_text in ((has_tools, False), (has_tools, True), (False, False)):
        messages = _conversation(template, tools, as_text)
        renders = [template.try_render(messages[:k]) for k in range(len(messages) + 1)]
        if all(text is not None for text in renders[1:]):
            break
    else:
        return []
    renders[0] = ""
    roles = [m["role"] for m in messages]
    present = sorted(set(roles), key=list(_ROLES).index)
    best: tuple[int, dict[str, int]] | None = None
    for choice in itertools.product(_STRENGTH, repeat=len(present)):
        rules = dict(zip(present, choice))
        score = _score(roles, renders, rules)
        if score is not None and (best is None or score > best[0]):
            best = (score, rules)
    if best is None:
        return []
    return [spb.PrefixBoundaryRule(role=_ROLES[r], constraint=c) for r, c in best[1].items()]


def _score(roles: list[str], renders: list[str], rules: dict[str, int]) -> int | None:
    """Total stable messages over all probe prefixes, or None when a stable part changes later."""
    total = 0
    for m in range(1, len(roles) + 1):
        count = stable_count(roles[:m], rules)
        stable = renders[count]
        if not all(renders[j].startswith(stable) for j in range(m, len(roles) + 1)):
            return None
        total += count
    return total
