"""The shared prompt path: messages -> chat template -> token ids, initial reasoning state, prefix boundary.

`PromptBuilder.build` validates OpenAI-style messages and tools, renders the core's chat template in
its sandbox, tokenizes the text (the template renders BOS and other template tokens itself), and
derives two facts from frozen `PromptRules` (the contract's frontend syntax data). Control markers
(special and markup added tokens) in client strings are tokenized as text, only the template's own
markers as control tokens (`helios.frontend.preparation.control_markers`); the facts below are read
from the rendering with client markers escaped, so client text cannot open or close anything:

- `reasoning_state`: read only from the open assistant envelope, i.e. the text after the last
  assistant header (``message_start + assistant_header``) when no later message starts. Inside it,
  only text after the last message end marker counts, so completed user, tool and assistant
  messages, and an embedded tool response that the template resumes after, cannot open reasoning.
  The last open delimiter after the last close delimiter or terminal marker means OPEN.
- `stable_prefix_len`: prompt tokens that later turns of the same conversation will render and
  tokenize identically, from the per-role prefix-boundary constraints; the prefix cache may publish
  reusable checkpoints up to it. The prefix is rendered from the same escaped inputs and tokenized
  by the same rule.

`/v1/completions` prompts are not built here: a raw prompt is the client's whole text, and the
markers in it are control tokens on purpose.

The builder holds immutable collaborators only and is safe to use from several preparation workers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping, Sequence

from tokenizers import Tokenizer

from helios.contract import serving_pb2 as spb
from helios.frontend.preparation.control_markers import ControlMarkers, TemplateInputs
from helios.frontend.preparation.image_parts import image_urls
from helios.frontend.preparation.messages import (
    ChatMessage,
    MessageError,
    Role,
    parse_messages,
    parse_tools,
    template_messages,
    template_tools,
)
from helios.errors import RequestError
from helios.frontend.preparation.template import ChatTemplate, TemplateRenderError
from helios.frontend.decoding.text_bounds import TextNotUnicode, check_unicode


# Request options of the rendering itself (vLLM's request fields), never template variables.
RENDERING_OPTIONS = ("add_generation_prompt", "continue_final_message")


class RenderingOptionError(RequestError):
    """``add_generation_prompt`` / ``continue_final_message`` that cannot apply to this request."""

    param = "continue_final_message"


class ReasoningState(enum.Enum):
    """Where generation starts relative to the reasoning envelope."""

    NO_REASONING = "no_reasoning"  # the model declares no tag reasoning syntax
    UNOPENED = "unopened"  # output starts outside reasoning; the model may open it
    OPEN = "open"  # the prompt opened reasoning; output starts inside it
    CLOSED = "closed"  # the prompt opened and closed reasoning; output starts with the answer


class PrefixConstraint(enum.Enum):
    """How a rendered message behaves when later messages are appended (PrefixBoundaryRule)."""

    STABLE = "stable"
    CHANGES_AFTER_USER_TURN = "changes_after_user_turn"
    CHANGES_WHEN_LAST = "changes_when_last"


@dataclass(frozen=True)
class ReasoningMarkup:
    """Tag reasoning delimiters as text; terminal markers end reasoning implicitly."""

    open: str
    close: str
    terminal_markers: tuple[str, ...] = ()


@dataclass(frozen=True)
class PromptRules:
    """Message boundaries, reasoning markup and per-role prefix constraints of one model.

    `message_ends` lists every text that completes a message (the contract's message_end, plus its
    internal message end and embedded message ends where declared). `prefix_boundaries` pairs each declared role with
    its constraint (a mapping is accepted and normalized to pairs); messages of undeclared roles are
    rejected, except developer messages, which render as system messages when only system is
    declared. Empty `prefix_boundaries` accepts every role and declares no stable prefix.
    """

    message_start: str
    assistant_header: str
    message_ends: tuple[str, ...]
    reasoning: ReasoningMarkup | None = None
    prefix_boundaries: tuple[tuple[Role, PrefixConstraint], ...] = ()

    def __post_init__(self):
        pairs = sorted(dict(self.prefix_boundaries).items(), key=lambda pair: list(Role).index(pair[0]))
        object.__setattr__(self, "prefix_boundaries", tuple(pairs))
        if not self.message_start + self.assistant_header:
            raise ValueError("an assistant envelope needs a header")
        if not all(self.message_ends):
            raise ValueError("message end markers must be non-empty")

    def constraint(self, role: Role) -> PrefixConstraint | None:
        return dict(self.prefix_boundaries).get(role)

    @property
    def declared_roles(self) -> frozenset[Role]:
        return frozenset(role for role, _ in self.prefix_boundaries)

    @classmethod
    def from_contract(cls, frontend) -> PromptRules:
        """From a `serving_pb2.FrontendContract` that the contract validators accepted."""
        boundary = frontend.assistant_boundary
        declared = (boundary.message_end, boundary.internal_message_end, *boundary.embedded_message_ends)
        ends = tuple(e for e in declared if e)
        reasoning = None
        if frontend.HasField("reasoning_syntax"):
            syntax = frontend.reasoning_syntax
            reasoning = ReasoningMarkup(syntax.open, syntax.close, tuple(syntax.terminal_markers))
        roles = {
            spb.MESSAGE_ROLE_SYSTEM: Role.SYSTEM,
            spb.MESSAGE_ROLE_DEVELOPER: Role.DEVELOPER,
            spb.MESSAGE_ROLE_USER: Role.USER,
            spb.MESSAGE_ROLE_ASSISTANT: Role.ASSISTANT,
            spb.MESSAGE_ROLE_TOOL: Role.TOOL,
        }
        constraints = {
            spb.PREFIX_CONSTRAINT_STABLE: PrefixConstraint.STABLE,
            spb.PREFIX_CONSTRAINT_CHANGES_AFTER_USER_TURN: PrefixConstraint.CHANGES_AFTER_USER_TURN,
            spb.PREFIX_CONSTRAINT_CHANGES_WHEN_LAST: PrefixConstraint.CHANGES_WHEN_LAST,
        }
        rules = {roles[r.role]: constraints[r.constraint] for r in frontend.prefix_boundaries}
        return cls(boundary.message_start, boundary.assistant_header, ends, reasoning, rules)


@dataclass(frozen=True)
class Prompt:
    """A prepared prompt; `assistant_prefill` is the envelope text that decided `reasoning_state` (a
    suffix of `text`).

    `text` is what the ids decode to: client markers read as their literal text there, so a reader
    looking for the template's controls (where a frame or the reasoning envelope starts) must look in
    `control_text` instead, and may slice `text` at the offsets it finds (the two are the same length).
    """

    text: str
    token_ids: tuple[int, ...]
    reasoning_state: ReasoningState
    assistant_prefill: str
    stable_prefix_len: int
    image_urls: tuple[str, ...] = ()  # the messages' image parts, in prompt order
    continues_message: bool = False  # it ends inside the final message (`continue_final_message`)
    escaped_text: str = ""  # the rendering with client markers escaped, where that changed it ("": `text`)

    @property
    def control_text(self) -> str:
        """`text` with each client marker's first character replaced (`ControlMarkers`), so only the
        template's own markers are found in it; character for character the length of `text`."""
        return self.escaped_text or self.text


class PromptBuilder:
    """Prepares chat prompts for one model; holds only immutable collaborators (thread-safe)."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, rules: PromptRules,
                 markers: ControlMarkers | None = None):
        """`markers` (which tokenize the prompts) default to the tokenizer's (`ControlMarkers.from_tokenizer`)."""
        self._template = template
        self._markers = markers or ControlMarkers.from_tokenizer(tokenizer)
        self._rules = rules

    def build(
        self,
        messages: object,
        tools: object = None,
        *,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool | None = None,
        template_kwargs: Mapping[str, object] | None = None,
    ) -> Prompt:
        """Validates, renders and tokenizes one chat request (RequestError subclasses on bad input).

        The rendering options (`rendering_options`) may also come in `template_kwargs`, as vLLM merges
        ``chat_template_kwargs`` over its request fields; they never reach the template as variables.
        With `continue_final_message` the prompt ends inside the final (assistant) message, whose text
        the model continues; that message is then no part of the stable prefix (its text will change)."""
        template_kwargs, add_generation_prompt, continue_final_message = rendering_options(
            template_kwargs, add_generation_prompt, continue_final_message)
        parsed = parse_messages(messages)
        self._check_roles(parsed)
        if continue_final_message:
            _check_continued(parsed)
        developer_as_system = Role.DEVELOPER not in self._rules.declared_roles
        inputs = self._markers.escape_inputs(
            template_messages(parsed, developer_as_system, self._template.content_part_roles),
            template_tools(parse_tools(tools)), template_kwargs)
        rendered = self._render(inputs, inputs.messages, add_generation_prompt, continue_final_message)
        text, token_ids = self._encode(rendered, inputs)
        state, prefill = initial_reasoning_state(rendered, self._rules)
        if continue_final_message and state is ReasoningState.UNOPENED and prefill.strip():
            # The continued message's answer has begun (a template that writes no reasoning envelope
            # into history): the output goes on with it, and opens no reasoning after answer text.
            state = ReasoningState.CLOSED
        if inputs.is_escaped:
            prefill = self._markers.restore(prefill)
        stable = self._stable_prefix_len(parsed[:-1] if continue_final_message else parsed, inputs, token_ids)
        return Prompt(text, token_ids, state, prefill, stable, tuple(image_urls(parsed)), continue_final_message,
                      rendered if rendered != text else "")

    def _check_roles(self, messages: tuple[ChatMessage, ...]) -> None:
        declared = self._rules.declared_roles
        if not declared:
            return
        for i, message in enumerate(messages):
            role = message.role
            if role is Role.DEVELOPER and role not in declared:
                role = Role.SYSTEM
            if role not in declared:
                raise MessageError(f"messages[{i}]: this model's template renders no {message.role.value} messages")

    def _render(self, inputs: TemplateInputs, messages: list[dict], add_generation_prompt: bool,
                continue_final_message: bool = False) -> str:
        return self._template.render(
            messages, tools=inputs.tools, add_generation_prompt=add_generation_prompt, template_kwargs=inputs.kwargs,
            continue_final_message=continue_final_message)

    def _encode(self, rendered: str, inputs: TemplateInputs) -> tuple[str, tuple[int, ...]]:
        try:
            check_unicode(rendered)  # a template may place request text (kwargs, tool JSON) anywhere
        except TextNotUnicode as error:  # the server checked the request's strings: decoded arguments remain
            raise TextNotUnicode(f"{error} (a tool call's arguments may escape one, such as \\ud800, and the "
                                 "chat template renders them decoded)", "messages") from None
        return self._markers.encode(rendered, inputs.is_escaped)

    def _stable_prefix_len(self, messages, inputs: TemplateInputs, token_ids: Sequence[int]) -> int:
        count = stable_message_count(messages, self._rules)
        if count == 0:
            return 0
        # template_messages renders each message on its own, so the escaped list's prefix is the
        # escaped prefix: a later turn escapes these messages the same way
        _, prefix_ids = self._encode(self._render(inputs, inputs.messages[:count], False), inputs)
        return _common_prefix_len(prefix_ids, token_ids)


def rendering_options(template_kwargs: Mapping[str, object] | None, add_generation_prompt: bool | None,
                      continue_final_message: bool | None) -> tuple[Mapping[str, object] | None, bool, bool]:
    """(the template's own kwargs, add_generation_prompt, continue_final_message) of a request.

    vLLM's rendering options, as arguments or as `template_kwargs` entries (vLLM merges
    ``chat_template_kwargs`` over its request fields; here the two places must agree). By default the
    prompt ends with the generation prompt; ``continue_final_message`` leaves it out, and asking for
    both is a `RenderingOptionError` (transformers refuses both at once)."""
    options = {RENDERING_OPTIONS[0]: add_generation_prompt, RENDERING_OPTIONS[1]: continue_final_message}
    if isinstance(template_kwargs, Mapping) and template_kwargs.keys() & options.keys():
        for name in options:
            if name not in template_kwargs:
                continue
            value = template_kwargs[name]
            if not isinstance(value, bool):
                raise TemplateRenderError(f"chat_template_kwargs.{name} must be a boolean", "chat_template_kwargs")
            if options[name] is not None and options[name] is not value:
                raise RenderingOptionError(
                    f"{name} {options[name]!r} contradicts chat_template_kwargs.{name}={value!r}; give one of them",
                    name)
            options[name] = value
        template_kwargs = {k: v for k, v in template_kwargs.items() if k not in options}
    add_generation_prompt, continue_final_message = options.values()
    if continue_final_message and add_generation_prompt:
        raise RenderingOptionError(
            "continue_final_message and add_generation_prompt are not compatible: continue_final_message continues "
            "the final assistant message, add_generation_prompt starts a new one", "continue_final_message")
    if add_generation_prompt is None:
        add_generation_prompt = not continue_final_message
    return template_kwargs, add_generation_prompt, bool(continue_final_message)


def _check_continued(messages: Sequence[ChatMessage]) -> None:
    """`RenderingOptionError` unless the final message is one `continue_final_message` may continue:
    an assistant message with text and no tool calls (the prompt would end before its calls, which
    the model would never see)."""
    final = messages[-1]
    where = f"messages[{len(messages) - 1}]"
    if final.role is not Role.ASSISTANT:
        raise RenderingOptionError(
            f"continue_final_message continues an assistant message; the final message ({where}) is a "
            f"{final.role.value} message", "continue_final_message")
    if final.tool_calls:
        raise RenderingOptionError(
            f"continue_final_message continues the final message's text; {where} has tool_calls, which the prompt "
            "would cut off", "continue_final_message")


def stable_message_count(messages: Sequence[ChatMessage], rules: PromptRules) -> int:
    """How many leading messages already render the way every later turn will render them."""
    for i, message in enumerate(messages):
        constraint = rules.constraint(message.role)
        if constraint is None and message.role is Role.DEVELOPER:
            constraint = rules.constraint(Role.SYSTEM)
        is_last = i == len(messages) - 1
        later_user = any(m.role is Role.USER for m in messages[i + 1 :])
        if (
            constraint is None
            or (constraint is PrefixConstraint.CHANGES_WHEN_LAST and is_last)
            or (constraint is PrefixConstraint.CHANGES_AFTER_USER_TURN and not later_user)
        ):
            return i
    return len(messages)


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def initial_reasoning_state(text: str, rules: PromptRules) -> tuple[ReasoningState, str]:
    """The reasoning state the open assistant envelope leaves, and the envelope text that decided it."""
    header = rules.message_start + rules.assistant_header
    at = text.rfind(header)
    if at < 0:
        return _no_envelope(rules)
    body_start = at + len(header)
    if rules.message_start and text.find(rules.message_start, body_start) >= 0:
        return _no_envelope(rules)  # a later message started: the assistant envelope is complete
    region_start = body_start
    for end in rules.message_ends:
        found = text.rfind(end, body_start)
        if found >= 0:
            region_start = max(region_start, found + len(end))
    region = text[region_start:]
    markup = rules.reasoning
    if markup is None:
        return ReasoningState.NO_REASONING, region
    opened = region.rfind(markup.open)
    closed = max((region.rfind(marker) for marker in (markup.close, *markup.terminal_markers)), default=-1)
    if opened > closed:
        return ReasoningState.OPEN, region
    if closed >= 0:
        return ReasoningState.CLOSED, region
    return ReasoningState.UNOPENED, region


def _no_envelope(rules: PromptRules) -> tuple[ReasoningState, str]:
    return (ReasoningState.NO_REASONING if rules.reasoning is None else ReasoningState.UNOPENED), ""
