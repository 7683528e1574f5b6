"""Client fields that carry no sampling value of their own: their meaning, in one place.

OpenAI clients send some fields whatever the request, often at their off values. The body schema
(`helios.server.schemas`) accepts exactly the values documented there; this module gives the ones
that change the request their effect:

- ``reasoning_effort`` (chat) maps to the family's thinking switch where it has one: the chat
  template argument ``enable_thinking`` (Qwen3, GLM) or ``thinking`` (DeepSeek-V3.1) when the core's
  chat template reads it. ``"none"`` turns thinking off, any other effort turns it on (Helios has no
  graded effort levels). A template without the switch renders as it always does. An explicit
  ``chat_template_kwargs.enable_thinking`` (or the template's own switch) that contradicts the
  effort is a 400. A template that reads no ``enable_thinking`` but a
  ``reasoning_effort`` argument of its own (gpt-oss: ``Reasoning: high`` in its system message)
  receives the effort itself, as `apply_chat_template(..., reasoning_effort=...)` passes it; an
  explicit ``chat_template_kwargs.reasoning_effort`` that differs is a 400, and so is an effort
  outside the grades such a template renders (``low``, ``medium``, ``high``: gpt-oss's harmony
  format knows no other), as OpenAI answers an effort a model does not support.
- ``user``, ``safety_identifier`` (chat), ``prompt_cache_key`` (chat: cached prefixes are found by
  their content whatever the key), ``metadata``, ``service_tier`` (``auto``/``default``: there is
  one tier), ``store`` (``false``: Helios keeps no completions) and ``modalities`` (chat:
  ``["text"]`` only) change nothing in the request; they are accepted so clients that always send
  them work. ``logprobs``/``top_logprobs`` are in `helios.frontend.decoding.logprobs`.
- OpenAI fields whose effect Helios does not have (``audio``, ``prediction``, ``verbosity``,
  ``web_search_options``, ``moderation``, ``prompt_cache_retention``, ``prompt_cache_options``,
  the legacy ``functions``/``function_call``, completions' ``suffix``) are accepted as null only
  (a client's "not given"); any other value is a 400 naming the field (`helios.server.schemas`).
"""

from __future__ import annotations

from typing import Any, Mapping

from jinja2 import TemplateError, meta

from helios.core.template_sandbox import BoundedSandbox
from helios.errors import RequestError

THINKING_KWARG = "enable_thinking"
THINKING_FLAG = "thinking"  # DeepSeek-V3.1's name for the switch
EFFORT_KWARG = "reasoning_effort"  # a template's graded effort argument (gpt-oss)
GRADED_EFFORTS = ("low", "medium", "high")  # the efforts a template's own EFFORT_KWARG renders


class ReasoningEffortConflict(RequestError):
    """``reasoning_effort`` contradicts an explicit ``chat_template_kwargs.enable_thinking`` (or
    ``chat_template_kwargs.reasoning_effort``)."""

    param = "reasoning_effort"


class UngradedReasoningEffort(RequestError):
    """``reasoning_effort`` is a value the core's chat template does not grade (its own
    ``reasoning_effort`` argument renders only `GRADED_EFFORTS`)."""

    param = "reasoning_effort"


def thinking_switch_of(chat_template_source: str) -> str | None:
    """The template argument that switches thinking (or grades it: `EFFORT_KWARG`), when the chat
    template reads one. Read from the variables the template takes from its arguments, not from its
    text: ``thinking`` is also a message field (gpt-oss reads ``message.thinking``), which is no
    switch."""
    try:
        names = meta.find_undeclared_variables(BoundedSandbox().parse(chat_template_source))
    except (TemplateError, RecursionError):  # a template that does not compile serves no request
        return None
    for name in (THINKING_KWARG, EFFORT_KWARG, THINKING_FLAG):
        if name in names:
            return name
    return None


def check_reasoning_effort(effort: str | None, template_kwargs: Mapping[str, Any] | None,
                           switch: str = THINKING_KWARG) -> bool | None:
    """Whether the effort turns thinking on (None: not given); `ReasoningEffortConflict` when an
    explicit ``enable_thinking`` template argument (or the boolean `switch` the template reads)
    says otherwise."""
    if effort is None:
        return None
    thinking = effort != "none"
    for name in dict.fromkeys((THINKING_KWARG, switch)):
        explicit = (template_kwargs or {}).get(name)
        if name != EFFORT_KWARG and explicit is not None and explicit is not thinking:
            raise ReasoningEffortConflict(
                f"reasoning_effort {effort!r} contradicts chat_template_kwargs.{name}={explicit!r}; give one of them")
    return thinking


def effective_template_kwargs(effort: str | None, template_kwargs: Mapping[str, Any] | None,
                              switch: str | None) -> dict[str, Any] | None:
    """The chat template arguments of a request: its explicit ones, plus the thinking switch its
    ``reasoning_effort`` sets when the template has one."""
    thinking = check_reasoning_effort(effort, template_kwargs, switch or THINKING_KWARG)
    if thinking is None or switch is None:
        return dict(template_kwargs) if template_kwargs is not None else None
    if switch == EFFORT_KWARG:
        explicit = (template_kwargs or {}).get(EFFORT_KWARG)
        if explicit is not None and explicit != effort:
            raise ReasoningEffortConflict(
                f"reasoning_effort {effort!r} contradicts chat_template_kwargs.{EFFORT_KWARG}={explicit!r}; "
                "give one of them")
        if effort not in GRADED_EFFORTS:  # rendered as given, "Reasoning: none" is a prompt no model knows
            raise UngradedReasoningEffort(
                f"reasoning_effort {effort!r} is not supported by this model: its chat template grades reasoning "
                f"as {', '.join(GRADED_EFFORTS[:-1])} or {GRADED_EFFORTS[-1]}")
        return {**(template_kwargs or {}), EFFORT_KWARG: effort}
    return {**(template_kwargs or {}), switch: thinking}
