"""Request options that need rules beyond the body schema: the single source of those rules.

The HTTP body models (`helios.server.schemas`) check shapes and ranges; the rules here combine
fields (stops with structured output, timestamps with token ids, stream options with streaming,
output-limit aliases, tool choice and parallel calls). Request preparation (`helios.frontend.session`) applies them,
and the server's early validation calls the same functions, so every rule has one implementation.
Bodies are read by attribute (`ChatOptionsBody`), so this module does not depend on the server.
Every failure is a `RequestError` subclass (HTTP 400).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from helios.errors import RequestError
from helios.frontend.preparation.client_fields import check_reasoning_effort
from helios.frontend.decoding.logprobs import requested_logprobs
from helios.frontend.decoding.observation import ObservationOptions, parse_optional_bool
from helios.frontend.decoding.stops import StopOptions, parse_stop_options


class ChatOptionError(RequestError):
    """Chat options that contradict each other or that this server does not implement; `param`
    names the field at fault (the error body's ``param``)."""


class ToolChoiceWithoutTools(ChatOptionError):
    """``tool_choice: "auto"`` in a request without tools (``tools`` left out or an empty list):
    there is nothing to choose from. OpenAI answers 400 ("tool_choice is only allowed when tools are
    specified"; an empty ``tools`` list is itself a 400 there, ``empty_array``), and so does vLLM
    (which refuses an empty list too since vllm-project/vllm#39780); serving it as plain chat hid
    the client's mistake (a forgotten or emptied tools list). An empty list without a tool choice
    (or with ``none``) is still served as no tools: clients send one where they have none, and
    nothing was asked of it; ``required`` or a named function without tools is a `ChatOptionError`
    of its own (nothing to call)."""

    param = "tool_choice"


class SamplingBody(Protocol):
    """Fields shared by chat and text completion bodies (pydantic models or equivalents)."""

    stream: bool | None
    stream_options: Any
    stop: str | list[str] | None
    stop_token_ids: list[int] | None
    stop_token_sequences: list[list[int]] | None
    return_token_ids: bool | None
    return_token_timestamps: bool | None
    max_tokens: int | None


class ChatOptionsBody(SamplingBody, Protocol):
    max_completion_tokens: int | None
    tools: Sequence[Any] | None
    tool_choice: Any
    parallel_tool_calls: bool | None
    response_format: Any


@dataclass(frozen=True)
class ResponseOptions:
    """How a response is delivered: streamed or not, the usage chunk, token observation."""

    is_stream: bool = False
    include_usage: bool = False
    observation: ObservationOptions = ObservationOptions()
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage on every chunk


def parse_response_options(body: SamplingBody) -> ResponseOptions:
    observation = ObservationOptions.parse(body.return_token_ids, body.return_token_timestamps)
    is_stream = parse_optional_bool("stream", body.stream)
    stream_options = body.stream_options
    if stream_options is not None and not is_stream:
        raise ChatOptionError("stream_options is only allowed when stream is true", "stream_options")
    include = parse_optional_bool("stream_options.include_usage", getattr(stream_options, "include_usage", None))
    continuous = parse_optional_bool("stream_options.continuous_usage_stats",
                                     getattr(stream_options, "continuous_usage_stats", None))
    if continuous and not include:  # vLLM ignores it there; a client asking for usage it will not get is told
        raise ChatOptionError("stream_options.continuous_usage_stats puts the usage on every chunk: it needs "
                              "stream_options.include_usage true", "stream_options.continuous_usage_stats")
    return ResponseOptions(is_stream, include, observation, continuous)


def parse_body_stops(body: SamplingBody, vocab_size: int, *, has_structured_output: bool = False) -> StopOptions:
    return parse_stop_options(
        body.stop,
        body.stop_token_ids,
        body.stop_token_sequences,
        vocab_size=vocab_size,
        has_structured_output=has_structured_output,
    )


def has_structured_output(body: ChatOptionsBody) -> bool:
    response_format = body.response_format
    return response_format is not None and getattr(response_format, "type", None) != "text"


def requested_output_limit(body: SamplingBody) -> int | None:
    """The explicit output limit: ``max_completion_tokens`` or its older alias ``max_tokens`` (clients
    that send both for older and newer servers send them equal; different values are a 400)."""
    newer = getattr(body, "max_completion_tokens", None)
    if newer is not None and body.max_tokens is not None and newer != body.max_tokens:
        raise ChatOptionError(f"max_tokens ({body.max_tokens}) and max_completion_tokens ({newer}) differ: give one "
                              "of them, not both with different values", "max_completion_tokens")
    return newer if newer is not None else body.max_tokens


def tool_names(body: ChatOptionsBody) -> tuple[str, ...]:
    names = tuple(tool.function.name for tool in body.tools or ())
    if len(set(names)) != len(names):
        raise ChatOptionError("tools: function names must be unique", "tools")
    return names


class ToolChoiceMode(enum.Enum):
    NONE = "none"  # no tools rendered or parsed (``none``, or no tools declared)
    AUTO = "auto"  # the model may call the tools or answer
    REQUIRED = "required"  # at least one call, no answer
    NAMED = "named"  # one call of the named function


@dataclass(frozen=True)
class ToolPolicy:
    """The request's tool options after the combined-field rules. ``parallel`` is
    ``parallel_tool_calls`` (true unless the request sets false)."""

    mode: ToolChoiceMode = ToolChoiceMode.NONE
    function: str = ""  # NAMED: the function the call must name
    parallel: bool = True

    @property
    def is_active(self) -> bool:
        """Tools are rendered into the prompt and parsed from the output."""
        return self.mode is not ToolChoiceMode.NONE

    @property
    def forces_call(self) -> bool:
        return self.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED)

    @property
    def needs_grammar(self) -> bool:
        """Only a tool-call grammar can honour the options (forcing a call, or at most one call)."""
        return self.forces_call or (self.is_active and not self.parallel)


def parse_tool_policy(body: ChatOptionsBody) -> ToolPolicy:
    """``tool_choice`` and ``parallel_tool_calls``: ``auto`` (the default) with tools, ``none``,
    ``required`` (needs tools) or a named function (must be declared); ``auto`` without ``tools``
    (or with an empty list) is `ToolChoiceWithoutTools`. Forcing and ``parallel_tool_calls=false``
    are enforced by a tool-call grammar (`helios.frontend.structured.grammar_request`)."""
    names = tool_names(body)
    parallel = body.parallel_tool_calls is not False
    choice = body.tool_choice
    if choice == "auto" and not body.tools:  # required and named choices without tools fail below
        raise ToolChoiceWithoutTools("tool_choice 'auto' is only allowed when tools are specified; give the "
                                     "tools, or leave tool_choice out")
    if choice is not None and not isinstance(choice, str):
        if choice.function.name not in names:
            raise ChatOptionError(f"tool_choice names an undeclared function {choice.function.name!r}", "tool_choice")
        return ToolPolicy(ToolChoiceMode.NAMED, choice.function.name, parallel)
    if choice == "required":
        if not names:
            raise ChatOptionError("tool_choice 'required' needs at least one tool", "tool_choice")
        return ToolPolicy(ToolChoiceMode.REQUIRED, parallel=parallel)
    if choice == "none" or not names:
        return ToolPolicy(ToolChoiceMode.NONE, parallel=parallel)
    return ToolPolicy(ToolChoiceMode.AUTO, parallel=parallel)


def tools_are_active(body: ChatOptionsBody) -> bool:
    """Whether the request's tools are rendered and parsed (any tool choice but ``none``, with tools)."""
    return parse_tool_policy(body).is_active


def parse_chat_stops(body: ChatOptionsBody, vocab_size: int) -> StopOptions:
    """The chat body's stops. String stops cannot cut grammar-constrained output that must be
    complete: neither a structured answer nor forced tool calls. ``parallel_tool_calls=false`` alone
    allows a free answer, which a stop string cuts as it cuts one under ``auto`` (a call it cuts is
    no call, as there): OpenAI and vLLM take the two together (it was a 400 here)."""
    stops = parse_body_stops(body, vocab_size, has_structured_output=has_structured_output(body))
    if stops.strings and parse_tool_policy(body).forces_call:
        raise ChatOptionError("stop strings cannot be combined with tool_choice forcing a call", "stop")
    return stops


def check_chat_options(body: ChatOptionsBody, vocab_size: int) -> None:
    """Every combined-field rule of a chat body (what preparation applies before rendering)."""
    parse_response_options(body)
    parse_tool_policy(body)
    parse_chat_stops(body, vocab_size)
    requested_output_limit(body)
    check_reasoning_effort(getattr(body, "reasoning_effort", None), getattr(body, "chat_template_kwargs", None))
    requested_logprobs(body, is_chat=True)


def check_completion_options(body: SamplingBody, vocab_size: int) -> None:
    parse_response_options(body)
    parse_body_stops(body, vocab_size)
