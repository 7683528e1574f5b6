"""The request body of OpenAI's Responses API (``POST /v1/responses``), as a strict pydantic model.

Helios serves the Responses API statelessly, as vLLM does without a store: a request carries its
whole conversation in ``input`` and is answered through the chat completion path
(`helios.server.responses_api`). The model is strict like the chat body (`helios.server.schemas`):
unknown fields are rejected, and fields whose effect Helios does not have take null (or their "off"
value) only, so a request is never answered as if an option it sent were honoured:
``previous_response_id`` and ``conversation`` (no response is kept: `NoStoredResponses`, HTTP 400),
``background: true``, ``truncation: "auto"`` (an input too long for the context is a 400, never cut),
hosted tools (only ``function`` tools), ``include`` values other than ``message.output_text.logprobs``,
reusable ``prompt`` templates, ``max_tool_calls``, ``text.verbosity``, encrypted reasoning.

``store`` is accepted either way (true is OpenAI's default, which clients send): nothing is stored,
and the response says ``store: false``. Input items given back from an earlier response (their
``id`` and ``status``, ``output_text`` parts with ``annotations`` and ``logprobs``, ``reasoning``
items, function calls and outputs with a null ``caller``, ``namespace`` and ``async``, an output's
tool ``name``) are accepted as history.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictStr, Tag, WithJsonSchema

from helios.frontend.decoding.logprobs import MAX_TOP_LOGPROBS
from helios.server.schemas import (
    MAX_MESSAGES, MAX_METADATA_ENTRIES, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS, MAX_TOOLS, JsonSchema,
    StrictInt, list_of, not_served,
)

LOGPROBS_INCLUDE = "message.output_text.logprobs"
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class InputText(StrictModel):
    type: Literal["input_text"]
    text: StrictStr


class OutputText(StrictModel):
    """An assistant's text part, as a response returned it (sent back as history)."""

    type: Literal["output_text"]
    text: StrictStr
    annotations: list[Any] | None = None  # a returned part's (Helios's are empty); history ignores them
    logprobs: list[Any] | None = None


class InputImage(StrictModel):
    """An image of a user message: a data: URL (remote URLs only when the server fetches them)."""

    type: Literal["input_image"]
    image_url: StrictStr = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None
    file_id: not_served("file_id", "no file store: send the image as image_url") = None


ContentPart = Annotated[Union[InputText, OutputText, InputImage], Field(discriminator="type")]


def _text_or(items: Any, forms: str) -> Any:
    """A text, or a list of `items`: a value is checked against the member its shape picks alone (an
    invalid list item is named ``input[0]``, not reported against the text member too)."""

    def shape(value: Any) -> str | None:
        return "text" if isinstance(value, str) else "list" if isinstance(value, list) else None

    return Annotated[Union[Annotated[StrictStr, Tag("text")], Annotated[items, Tag("list")]],
                     Discriminator(shape, custom_error_type="text_or_list", custom_error_message=forms)]


class MessageItem(StrictModel):
    """A message of the conversation (``type`` may be left out, as OpenAI's easy input messages do)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: _text_or(list_of(ContentPart, 1024), "a message's content is a text or a list of content parts")
    id: StrictStr | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(StrictModel):
    """A function call the model made (an earlier response's output item), given back as history."""

    type: Literal["function_call"]
    call_id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    arguments: StrictStr
    id: StrictStr | None = None
    status: ItemStatus | None = None
    # A returned call's fields that Helios's calls leave null (the client's item type has them, and a
    # call dumped by alias sends them): null says nothing; a value would be a call Helios cannot make.
    caller: not_served("caller", "every call is the model's own") = None
    namespace: not_served("namespace", "function tools have no namespaces") = None
    async_: not_served("async", "calls run in the client") = Field(default=None, alias="async")


class FunctionCallOutputItem(StrictModel):
    """The result of a function call (``call_id`` names the call), for the model's next turn."""

    type: Literal["function_call_output"]
    call_id: StrictStr = Field(min_length=1)
    output: _text_or(list_of(InputText, 1024), "a function call's output is a text or a list of input_text parts")
    id: StrictStr | None = None
    status: ItemStatus | None = None
    name: StrictStr | None = Field(default=None, description="The called function's name: the tool message's name")
    caller: not_served("caller", "every call is the model's own") = None
    namespace: not_served("namespace", "function tools have no namespaces") = None


class SummaryText(StrictModel):
    type: Literal["summary_text"]
    text: StrictStr


class ReasoningText(StrictModel):
    type: Literal["reasoning_text"]
    text: StrictStr


class ReasoningItem(StrictModel):
    """An earlier response's reasoning, given back: its text is the next assistant turn's reasoning."""

    type: Literal["reasoning"]
    id: StrictStr | None = None
    summary: list[SummaryText] = Field(default_factory=list, max_length=1024)
    content: list[ReasoningText] | None = Field(default=None, max_length=1024)
    encrypted_content: not_served("encrypted_content", "no encrypted reasoning") = None
    status: ItemStatus | None = None


def _item_type(value: Any) -> str | None:
    """An input item's member: its ``type``, ``message`` where it has none (an easy input message)."""
    if isinstance(value, dict):
        kind = value.get("type", "message")
        return kind if isinstance(kind, str) else None
    return getattr(value, "type", None)


INPUT_ITEMS = "an input item is a message, function_call, function_call_output or reasoning item"
InputItem = Annotated[Union[
    Annotated[MessageItem, Tag("message")],
    Annotated[FunctionCallItem, Tag("function_call")],
    Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Annotated[ReasoningItem, Tag("reasoning")],
], Discriminator(_item_type, custom_error_type="input_item", custom_error_message=INPUT_ITEMS)]


class FunctionTool(StrictModel):
    """A function tool in the Responses shape (the chat body's tool, unnested)."""

    type: Literal["function"]
    name: StrictStr = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: StrictStr | None = None
    parameters: JsonSchema | None = None
    strict: StrictBool | None = None


class FunctionToolChoice(StrictModel):
    type: Literal["function"]
    name: StrictStr


class TextFormatText(StrictModel):
    type: Literal["text"]


class TextFormatJsonObject(StrictModel):
    type: Literal["json_object"]


class TextFormatJsonSchema(StrictModel):
    type: Literal["json_schema"]
    name: StrictStr = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    schema_: JsonSchema = Field(alias="schema")
    description: StrictStr | None = None
    strict: StrictBool | None = None


TextFormat = Annotated[Union[TextFormatText, TextFormatJsonObject, TextFormatJsonSchema], Field(discriminator="type")]


class TextConfig(StrictModel):
    format: TextFormat | None = None
    verbosity: not_served("text.verbosity", "the model's answer length is not graded") = None


class ReasoningConfig(StrictModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = Field(
        default=None, description="As chat's reasoning_effort")
    summary: Literal["auto", "concise", "detailed"] | None = Field(
        default=None, description="Accepted: the reasoning item holds the model's reasoning text (content), "
        "its summary stays empty")
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(StrictModel):
    include_obfuscation: Literal[False] | None = Field(
        default=None, description="Helios pads no event with an obfuscation field: false only")


class ResponsesRequest(StrictModel):
    """``POST /v1/responses`` (see the module docstring)."""

    model: StrictStr
    input: _text_or(list_of(InputItem, MAX_MESSAGES, min_len=1), "input is a text or a list of input items")
    instructions: StrictStr | None = Field(default=None, description="A system message before the input")
    tools: list_of(FunctionTool, MAX_TOOLS) | None = None
    tool_choice: Union[Literal["none", "auto", "required"], FunctionToolChoice, None] = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stream: StrictBool | None = None
    stream_options: ResponsesStreamOptions | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    include: list_of(Literal["message.output_text.logprobs"], 8) | None = Field(
        default=None, description="message.output_text.logprobs only: each output token's log-probability")
    top_logprobs: StrictInt | None = Field(
        default=None, ge=0, le=MAX_TOP_LOGPROBS,
        description="Alternatives per output token with include message.output_text.logprobs (else unused)")
    metadata: dict[Annotated[StrictStr, Field(max_length=MAX_METADATA_KEY_CHARS)],
                   Annotated[StrictStr, Field(max_length=MAX_METADATA_VALUE_CHARS)]] | None = Field(
        default=None, max_length=MAX_METADATA_ENTRIES, description="Client tags (at most 16), returned on the response")
    user: StrictStr | None = Field(default=None, max_length=256,
                                   description="An end-user id; appears in the access log, nowhere else")
    safety_identifier: StrictStr | None = Field(default=None, max_length=256)
    prompt_cache_key: StrictStr | None = Field(default=None, max_length=256)
    store: StrictBool | None = Field(default=None, description="Accepted either way: Helios keeps no responses")
    service_tier: Literal["auto", "default"] | None = None
    truncation: Literal["disabled"] | None = Field(
        default=None, description="disabled only: an input longer than the context is refused, never cut")
    background: Literal[False] | None = Field(default=None, description="false only: responses run in the foreground")
    # Documented as null only; any other value is refused by `responses_api.check_stateless`, which says why.
    previous_response_id: Annotated[Any, WithJsonSchema({
        "type": "null", "description": "Not served (this server keeps no responses; send the whole conversation "
        "as input): null only"})] = None
    conversation: Annotated[Any, WithJsonSchema({
        "type": "null", "description": "Not served (this server keeps no conversations): null only"})] = None
    prompt: not_served("prompt", "no stored prompt templates") = None
    max_tool_calls: not_served("max_tool_calls", "calls are bounded by tool_choice and parallel_tool_calls") = None
