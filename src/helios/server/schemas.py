"""Request bodies the HTTP API accepts, as strict pydantic models.

Unknown fields are rejected (never silently ignored), so the OpenAPI document generated from these
models is exactly what the server accepts. Semantic rules that pydantic cannot express (stops that
cannot be combined, observation flags that require each other) are checked in `validate_*` below
and raise `RequestError`, which the app turns into HTTP 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from helios.errors import RequestError

MAX_STOP_STRINGS = 4
MAX_STOP_BYTES = 4096
MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_LEN = 64


class InvalidRequest(RequestError):
    """A request body that parses but breaks a rule of the API."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(_Strict):
    name: StrictStr
    arguments: StrictStr


class ToolCall(_Strict):
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Strict):
    role: Literal["system", "developer"]
    content: Union[StrictStr, list[TextPart]]
    name: StrictStr | None = None


class UserMessage(_Strict):
    role: Literal["user"]
    content: Union[StrictStr, list[TextPart]]
    name: StrictStr | None = None


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: Union[StrictStr, list[TextPart], None] = None
    reasoning_content: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    name: StrictStr | None = None


class ToolMessage(_Strict):
    role: Literal["tool"]
    content: Union[StrictStr, list[TextPart]]
    tool_call_id: StrictStr


Message = Annotated[
    Union[SystemMessage, UserMessage, AssistantMessage, ToolMessage], Field(discriminator="role")
]


class FunctionDefinition(_Strict):
    name: StrictStr = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: StrictStr


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: StrictStr = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: StrictStr | None = None
    strict: StrictBool | None = None


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


class RegexFormat(_Strict):
    """Extension: the answer matches a regular expression."""

    type: Literal["regex"]
    regex: StrictStr = Field(min_length=1)


class GrammarFormat(_Strict):
    """Extension: the answer matches a Lark grammar (llguidance dialect)."""

    type: Literal["grammar"]
    grammar: StrictStr = Field(min_length=1)


class ChoiceFormat(_Strict):
    """Extension: the answer is exactly one of the given strings."""

    type: Literal["choice"]
    choices: list[StrictStr] = Field(min_length=1, max_length=256)


ResponseFormat = Annotated[
    Union[
        TextFormat, JsonObjectFormat, JsonSchemaResponseFormat, RegexFormat, GrammarFormat, ChoiceFormat
    ],
    Field(discriminator="type"),
]


class StreamOptions(_Strict):
    include_usage: StrictBool | None = None


StopField = Union[StrictStr, list[StrictStr], None]


class _SamplingFields(_Strict):
    """Fields shared by chat and text completions."""

    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    seed: StrictInt | None = Field(default=None, ge=-(2**63), lt=2**63)
    n: StrictInt | None = Field(default=None, ge=1, le=1)
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    stop: StopField = None
    stop_token_ids: list[StrictInt] | None = None
    stop_token_sequences: list[list[StrictInt]] | None = None
    user: StrictStr | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Union[StrictBool, StrictInt, float, StrictStr, None]] | None = None
    return_token_ids: StrictBool | None = None
    return_token_timestamps: StrictBool | None = None


class CompletionRequest(_SamplingFields):
    prompt: Union[StrictStr, list[StrictInt]]
    echo: Literal[False] | None = None
    return_token_ids: StrictBool | None = None
    return_token_timestamps: StrictBool | None = None


def stop_strings(stop: StopField) -> tuple[str, ...]:
    """Normalises `stop` to a tuple, enforcing the count, emptiness and byte-size rules."""
    if stop is None:
        return ()
    strings = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(strings) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"stop: at most {MAX_STOP_STRINGS} strings are allowed")
    if any(not s for s in strings):
        raise InvalidRequest("stop: stop strings must be non-empty")
    if sum(len(s.encode("utf-8")) for s in strings) > MAX_STOP_BYTES:
        raise InvalidRequest(f"stop: stop strings total more than {MAX_STOP_BYTES} UTF-8 bytes")
    return strings


def validate_common(body: _SamplingFields, vocab_size: int) -> None:
    """Rules shared by both endpoints that need the served model's vocabulary."""
    strings = stop_strings(body.stop)
    token_stops = bool(body.stop_token_ids) or bool(body.stop_token_sequences)
    if strings and token_stops:
        raise InvalidRequest("stop cannot be combined with stop_token_ids or stop_token_sequences")
    for token_id in body.stop_token_ids or ():
        if not 0 <= token_id < vocab_size:
            raise InvalidRequest(f"stop_token_ids: {token_id} is outside the vocabulary [0, {vocab_size})")
    sequences = body.stop_token_sequences or ()
    if len(sequences) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(f"stop_token_sequences: at most {MAX_STOP_SEQUENCES} sequences are allowed")
    for sequence in sequences:
        if not 1 <= len(sequence) <= MAX_STOP_SEQUENCE_LEN:
            raise InvalidRequest(f"stop_token_sequences: each sequence holds 1 to {MAX_STOP_SEQUENCE_LEN} ids")
        if any(not 0 <= t < vocab_size for t in sequence):
            raise InvalidRequest(f"stop_token_sequences: ids must lie in [0, {vocab_size})")
    if body.return_token_timestamps and not body.return_token_ids:
        raise InvalidRequest("return_token_timestamps requires return_token_ids")
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest("stream_options is only allowed when stream is true")


def validate_chat(body: ChatCompletionRequest, vocab_size: int) -> None:
    """Chat-specific rules on top of `validate_common`."""
    validate_common(body, vocab_size)
    structured = body.response_format is not None and body.response_format.type != "text"
    if structured and (body.stop is not None and stop_strings(body.stop)):
        raise InvalidRequest("stop strings cannot be combined with structured output (response_format)")
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        raise InvalidRequest("give max_tokens or max_completion_tokens, not both")
    names = [tool.function.name for tool in body.tools or ()]
    if len(set(names)) != len(names):
        raise InvalidRequest("tools: function names must be unique")
    choice = body.tool_choice
    if choice is not None and not isinstance(choice, str) and choice.function.name not in names:
        raise InvalidRequest(f"tool_choice names an undeclared function {choice.function.name!r}")
    if choice == "required" and not names:
        raise InvalidRequest("tool_choice 'required' needs at least one tool")
