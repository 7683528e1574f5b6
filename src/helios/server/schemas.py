"""Request bodies the HTTP API accepts, as strict pydantic models.

Unknown fields are rejected (never silently ignored), so the OpenAPI document generated from these
models is exactly what the server accepts. Rules that combine fields (stops that cannot be combined,
observation flags that require each other, tool choice) live in `helios.frontend.preparation.request_options`,
their single source; `validate_*` below apply them before preparation. They raise `RequestError`
subclasses, which the app turns into HTTP 400.

Types are strict (``"temperature": "0.5"`` or ``true`` where a number belongs is a 400, as the
OpenAPI document says), and every list and free-form object has a bound, so the work one request
can cause is bounded before preparation: `MAX_MESSAGES` messages, `MAX_TOOLS` tools, JSON
schemas (tool parameters, response schemas) of at most `MAX_SCHEMA_NBYTES` encoded and
`MAX_SCHEMA_DEPTH` deep, grammars of at most `MAX_GRAMMAR_CHARS`, regular expressions of at most
`MAX_REGEX_CHARS`. Text length is bounded by the body size (`helios.server.body_guard`) and, before
tokenizing, by the model's context extent (`helios.frontend.session`). A bounded list is refused by its
length before any of its items is validated (`list_of`).

A message's text parts (at most `MAX_TEXT_PARTS`) and an assistant message's tool calls (at most
`MAX_TOOL_CALLS`) are counted by `validate_chat`, before admission and preparation, rather than as
``maxItems`` of the document: bounds nested inside `MAX_MESSAGES` messages would let a body the
document allows outgrow the body limit (1,024 messages of 1,024 parts), which a generator of valid
bodies would then meet as a 413. Image parts have their own bound (``--max-images``), counted before
the prompt is rendered (`helios.frontend.preparation.prompt_images`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, StrictBool,
                      StrictStr, Tag, WithJsonSchema)
from pydantic_core import PydanticCustomError, PydanticKnownError

from helios.errors import RequestError
from helios.frontend.preparation.logit_bias import MAX_LOGIT_BIAS
from helios.frontend.decoding.logprobs import MAX_TOP_LOGPROBS
from helios.frontend.decoding.stops import MAX_STOP_STRINGS, MAX_STOP_TOKEN_SEQUENCE_LEN, MAX_STOP_TOKEN_SEQUENCES
from helios.frontend.preparation.request_options import ChatOptionError, check_chat_options, check_completion_options
from helios.server.echo import clipped

MAX_MESSAGES = 1024
MAX_TOOLS = 128
MAX_TEXT_PARTS = 1024  # text parts of one message's content (`validate_chat`)
MAX_TOOL_CALLS = 128  # tool calls of one assistant message, as many as a request may declare tools
MAX_SCHEMA_NBYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_GRAMMAR_CHARS = 64 * 1024
MAX_REGEX_CHARS = 4096
MAX_CHOICE_CHARS = 4096
MAX_TEMPLATE_KWARGS = 64
MAX_CHOICES = 16  # n, and n times the prompts of a batch (helios.server.fanout)
MAX_METADATA_ENTRIES = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


def _bounded_schema(value: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema no larger than `MAX_SCHEMA_NBYTES` encoded, nested at most `MAX_SCHEMA_DEPTH`."""
    if len(json.dumps(value, ensure_ascii=False)) > MAX_SCHEMA_NBYTES:
        raise ValueError(f"a schema may be at most {MAX_SCHEMA_NBYTES} characters of JSON")
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"a schema may nest at most {MAX_SCHEMA_DEPTH} levels")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return value


JsonSchema = Annotated[dict[str, Any], AfterValidator(_bounded_schema)]


def _at_most(max_len: int) -> BeforeValidator:
    """Refuses a list longer than `max_len` before its items are validated, with pydantic's own
    ``too_long`` error (the same type and text): pydantic applies ``max_length`` only after it has
    validated every item (a 4 MiB body holds a million), and each union member validates them again."""

    def check(value: Any) -> Any:
        if isinstance(value, list) and len(value) > max_len:
            raise PydanticKnownError("too_long", {"field_type": "List", "max_length": max_len,
                                                  "actual_length": len(value)})
        return value

    return BeforeValidator(check)


def list_of(item: Any, max_len: int, min_len: int | None = None) -> Any:
    """The type of a list of `item`s, `min_len` to `max_len` of them, whose length is checked
    before its items are (see `_at_most`); the schema says the same bounds."""
    return Annotated[list[item], Field(min_length=min_len, max_length=max_len), _at_most(max_len)]


def _integral_number(value: Any) -> Any:
    """``4.0`` as ``4``: JSON Schema's ``integer`` (what the OpenAPI document says) is any number
    with no fractional part; ``4.5``, strings and booleans stay rejected."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


# An integer as JSON Schema means it (see `_integral_number`); otherwise strict like `StrictInt`.
StrictInt = Annotated[int, BeforeValidator(_integral_number)]


def _top_k_off(value: int | None) -> int | None:
    """vLLM's ``top_k: -1`` ("consider all tokens", its default, which clients written for it send) as
    ``0``, Helios's spelling of the same: an explicit value that turns top-k off, not the core's default."""
    return 0 if value == -1 else value


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TextPart(StrictModel):
    type: Literal["text"]
    text: StrictStr


class ImageUrl(StrictModel):
    url: StrictStr = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


class ImageUrlPart(StrictModel):
    """An image of a user message: a data: URL (remote URLs only when the server fetches them)."""

    type: Literal["image_url"]
    image_url: ImageUrl


UserPart = Annotated[Union[TextPart, ImageUrlPart], Field(discriminator="type")]


def _text_content(message: str) -> Any:
    """The content type of `message` (a system message, ...): a text or text parts. An image part
    there is refused with one error that says where images belong: validated as text parts, it was
    four errors ending in ``image_url: not a field this server accepts``, which read as images not
    being served at all. The schema is the plain union's (a `BeforeValidator` adds nothing to it)."""

    def no_image_parts(value: Any) -> Any:
        if isinstance(value, list):
            for index, part in enumerate(value):
                if isinstance(part, dict) and part.get("type") == "image_url":
                    raise PydanticCustomError(
                        "image_part_outside_user_message",
                        "part {index} is an image_url part; image parts belong in user messages ({message} takes "
                        "a text or text parts)", {"index": index, "message": message})
        return value

    return Annotated[Union[StrictStr, list[TextPart]], BeforeValidator(no_image_parts)]


class FunctionCall(StrictModel):
    name: StrictStr = Field(min_length=1)
    arguments: StrictStr


class ToolCall(StrictModel):
    id: StrictStr = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(StrictModel):
    role: Literal["system", "developer"]
    content: _text_content("a system or developer message")
    name: StrictStr | None = None


class UserMessage(StrictModel):
    role: Literal["user"]
    content: Union[StrictStr, list[UserPart]] = Field(
        description=f"A text, or parts: at most {MAX_TEXT_PARTS} text parts and the server's --max-images images")
    name: StrictStr | None = None


class AssistantMessage(StrictModel):
    role: Literal["assistant"]
    content: _text_content("an assistant message") | None = None
    reasoning_content: StrictStr | None = None
    reasoning: StrictStr | None = Field(default=None, description="vLLM's newer name for reasoning_content")
    tool_calls: list[ToolCall] | None = Field(default=None, description=f"At most {MAX_TOOL_CALLS} calls")
    name: StrictStr | None = None
    # Fields of a response message (the openai client's `ChatCompletionMessage.model_dump()`, sent
    # back as history) that say nothing when null, so null is accepted; any other value (a refusal,
    # audio, a legacy function call, annotations) is a 400 naming the field.
    refusal: None = None
    audio: None = None
    function_call: None = None
    annotations: None = None


class ToolMessage(StrictModel):
    role: Literal["tool"]
    content: _text_content("a tool message")
    tool_call_id: StrictStr = Field(min_length=1)
    name: StrictStr | None = None  # the called function's name, as clients (and OpenAI's examples) send it


Message = Annotated[
    Union[SystemMessage, UserMessage, AssistantMessage, ToolMessage], Field(discriminator="role")
]


class FunctionDefinition(StrictModel):
    name: StrictStr = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: StrictStr | None = None
    parameters: JsonSchema | None = None
    strict: StrictBool | None = None


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: StrictStr


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(StrictModel):
    # OpenAI's rule for the name: letters, digits, underscores and dashes, at most 64
    name: StrictStr = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    schema_: JsonSchema = Field(alias="schema")
    description: StrictStr | None = None
    strict: StrictBool | None = None


class TextFormat(StrictModel):
    type: Literal["text"]


class JsonObjectFormat(StrictModel):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(StrictModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


class RegexFormat(StrictModel):
    """Extension: the answer matches a regular expression."""

    type: Literal["regex"]
    regex: StrictStr = Field(min_length=1, max_length=MAX_REGEX_CHARS)


class GrammarFormat(StrictModel):
    """Extension: the answer matches a Lark grammar (llguidance dialect)."""

    type: Literal["grammar"]
    grammar: StrictStr = Field(min_length=1, max_length=MAX_GRAMMAR_CHARS)


class ChoiceFormat(StrictModel):
    """Extension: the answer is exactly one of the given strings."""

    type: Literal["choice"]
    choices: list_of(Annotated[StrictStr, Field(min_length=1, max_length=MAX_CHOICE_CHARS)], 256, min_len=1)


ResponseFormat = Annotated[
    Union[
        TextFormat, JsonObjectFormat, JsonSchemaResponseFormat, RegexFormat, GrammarFormat, ChoiceFormat
    ],
    Field(discriminator="type"),
]


class StreamOptions(StrictModel):
    include_usage: StrictBool | None = None
    continuous_usage_stats: StrictBool | None = Field(
        default=None, description="Extension (vLLM): every chunk carries the usage so far (needs include_usage)")
    include_obfuscation: Literal[False] | None = Field(
        default=None, description="Helios pads no chunk with an obfuscation field: false only")


def not_served(field: str, reason: str) -> Any:
    """The type of an OpenAI field Helios does not serve: null (what a client that always sends
    the field sends for "not given") is accepted and means nothing; any other value is a 400 naming
    the field, with `reason`. The document says the same (``null`` only)."""

    def null_only(value: Any) -> None:
        if value is not None:
            raise ValueError(f"{field} is not served here ({reason}); omit it or send null")
        return None

    return Annotated[None, BeforeValidator(null_only),
                     WithJsonSchema({"type": "null", "description": f"Not served ({reason}): null only"})]


_StopString = Annotated[StrictStr, Field(min_length=1)]
StopField = Union[_StopString, list_of(_StopString, MAX_STOP_STRINGS), None]
_TokenId = Annotated[StrictInt, Field(ge=0)]
_TOKEN_KEY = r"^[0-9]{1,9}$"
# Token id (decimal string) -> bias; the JSON schema says exactly that (every key matches the pattern).
LogitBias = Annotated[
    dict[Annotated[StrictStr, Field(pattern=_TOKEN_KEY)], Annotated[float, Field(ge=-100.0, le=100.0)]],
    WithJsonSchema({"type": "object", "maxProperties": MAX_LOGIT_BIAS, "propertyNames": {"pattern": _TOKEN_KEY},
                    "additionalProperties": {"type": "number", "minimum": -100.0, "maximum": 100.0}}),
]


class _SamplingFields(StrictModel):
    """Fields shared by chat and text completions."""

    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0,
                                description="Nucleus sampling; 0 keeps only the most probable token")
    top_k: Annotated[StrictInt | None, AfterValidator(_top_k_off)] = Field(
        default=None, ge=-1, description="Keep the k most probable tokens; 0, or vLLM's -1, keeps every token")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    seed: StrictInt | None = Field(default=None, ge=-(2**63), lt=2**63)
    n: StrictInt | None = Field(default=None, ge=1, le=MAX_CHOICES,
                                description="Choices per prompt (each its own engine request; choice j samples with seed + j)")
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    stop: StopField = None
    # together at most MAX_STOP_TOKEN_SEQUENCES stops (a rule of both fields, checked in preparation)
    stop_token_ids: list_of(_TokenId, MAX_STOP_TOKEN_SEQUENCES) | None = None
    stop_token_sequences: list_of(list_of(_TokenId, MAX_STOP_TOKEN_SEQUENCE_LEN, min_len=1),
                                    MAX_STOP_TOKEN_SEQUENCES) | None = None
    user: StrictStr | None = Field(default=None, max_length=256,
                                   description="An end-user id; appears in the access log, nowhere else")
    metadata: dict[Annotated[StrictStr, Field(max_length=MAX_METADATA_KEY_CHARS)],
                   Annotated[StrictStr, Field(max_length=MAX_METADATA_VALUE_CHARS)]] | None = Field(
        default=None, max_length=MAX_METADATA_ENTRIES,
        description="Client tags (at most 16); accepted and validated, not stored")
    store: Literal[False] | None = Field(default=None, description="Helios keeps no completions: only false")
    service_tier: Literal["auto", "default"] | None = Field(
        default=None, description="There is one tier: auto and default both mean it")
    logit_bias: LogitBias | None = Field(
        default=None, max_length=MAX_LOGIT_BIAS,
        description="Token id -> bias in [-100, 100] added to its logit before sampling (at most 300 ids)")
    prompt_logprobs: StrictInt | None = Field(
        default=None, ge=0, le=MAX_TOP_LOGPROBS,
        description="Extension (vLLM): each prompt token's log-probability and this many alternatives "
        "(needs a text-only core prepared with --scored-prefill)")


class ChatCompletionRequest(_SamplingFields):
    messages: list_of(Message, MAX_MESSAGES, min_len=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    tools: list_of(Tool, MAX_TOOLS) | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Union[StrictBool, StrictInt, float, StrictStr, None]] | None = Field(
        default=None, max_length=MAX_TEMPLATE_KWARGS,
        description="Extra chat template arguments (for example enable_thinking); add_generation_prompt and "
        "continue_final_message here are the request fields of those names, as vLLM merges them")
    add_generation_prompt: StrictBool | None = Field(
        default=None, description="Extension (vLLM): end the prompt with the assistant turn's header (default: true, "
        "false with continue_final_message)")
    continue_final_message: StrictBool | None = Field(
        default=None, description="Extension (vLLM): the final message, an assistant message, is left open and the "
        "model continues its text (prefill); the response holds only the new text. Not with add_generation_prompt")
    return_token_ids: StrictBool | None = None
    return_token_timestamps: StrictBool | None = None
    logprobs: StrictBool | None = Field(
        default=None, description="Return each output token's log-probability (choices[].logprobs.content)")
    top_logprobs: StrictInt | None = Field(
        default=None, ge=0, le=MAX_TOP_LOGPROBS,
        description="Most probable alternatives per output token, 0-20 (a nonzero value needs logprobs: true)")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = Field(
        default=None, description="Sets the family's thinking switch (the chat template argument "
        "enable_thinking, or DeepSeek-V3.1's thinking) where it has one: none turns thinking off, any other value "
        "on (a contradicting chat_template_kwargs switch is a 400); a template that grades reasoning itself "
        "(gpt-oss) takes low, medium or high only")
    safety_identifier: StrictStr | None = Field(default=None, max_length=256,
                                                description="An end-user id (as user); changes nothing in the response")
    prompt_cache_key: StrictStr | None = Field(
        default=None, max_length=256, description="A cache-routing hint: cached prompt prefixes are reused by "
        "their content whatever the key, so it changes nothing in the response")
    modalities: list_of(Literal["text"], 2, min_len=1) | None = Field(
        default=None, description="[\"text\"] only: Helios generates text")
    # OpenAI fields whose effect Helios does not have: null only (see `not_served`).
    audio: not_served("audio", "Helios generates text only") = None
    prediction: not_served("prediction", "no predicted outputs") = None
    verbosity: not_served("verbosity", "the model's answer length is not graded") = None
    web_search_options: not_served("web_search_options", "no web search") = None
    moderation: not_served("moderation", "no moderation") = None
    prompt_cache_retention: not_served("prompt_cache_retention", "cached prefixes live while cache pages allow") = None
    prompt_cache_options: not_served("prompt_cache_options", "cached prefixes are found by their content") = None
    functions: not_served("functions", "legacy function calling: declare them as tools") = None
    function_call: not_served("function_call", "legacy function calling: use tool_choice") = None


def _prompt_shape(value: Any) -> str | None:
    """The `Prompt` member a value is meant as, from its shape: an invalid prompt is then reported
    against that member alone (``prompt[0]: ... greater than or equal to 0``), not every member.
    None (no member: `PROMPT_FORMS` is the error) for what is neither a text nor a list (null,
    which OpenAI reads as an empty document, included)."""
    if isinstance(value, str):
        return "text"
    if not isinstance(value, list):
        return None
    if value and isinstance(value[0], (str, list)):
        return "texts" if isinstance(value[0], str) else "token_lists"
    return "tokens"


PROMPT_FORMS = "the prompt is a text, a list of token ids, or a batch: a list of texts or of token-id lists"


Prompt = Annotated[Union[
    Annotated[StrictStr, Tag("text")],
    Annotated[list[_TokenId], Tag("tokens")],
    Annotated[list_of(StrictStr, MAX_CHOICES, min_len=1), Tag("texts")],
    Annotated[list_of(list[_TokenId], MAX_CHOICES, min_len=1), Tag("token_lists")],
], Discriminator(_prompt_shape, custom_error_type="prompt_form", custom_error_message=PROMPT_FORMS)]


class CompletionRequest(_SamplingFields):
    prompt: Prompt = Field(
        description="A text or token ids, or a batch of texts or of token-id lists (one choice set each)")
    best_of: StrictInt | None = Field(default=None, ge=1, le=MAX_CHOICES,
                                      description="Accepted where it means the same as n: equal to n (or 1 without n)")
    max_tokens: StrictInt | None = Field(
        default=None, ge=0, description="The output limit; 0 (with echo or prompt_logprobs) returns no output")
    echo: StrictBool | None = Field(
        default=None, description="Return the prompt text before the output (with logprobs: the prompt tokens' "
        "log-probabilities too, which needs a text-only core prepared with --scored-prefill)")
    logprobs: StrictInt | None = Field(
        default=None, ge=0, le=MAX_TOP_LOGPROBS,
        description="Return each output token's log-probability and this many most probable alternatives (0-20)")
    return_token_ids: StrictBool | None = None
    return_token_timestamps: StrictBool | None = None
    suffix: not_served("suffix", "no insertion: the output continues the prompt") = None


class TooManyParts(RequestError):
    """A message of more text parts, or tool calls, than one message may hold; `param` names it."""


class ModelNotFound(RequestError):
    """The request names a model this server does not serve (404, as OpenAI answers)."""

    http_status = 404
    param = "model"


def check_model(name: str, served_names: tuple[str, ...]) -> None:
    """`ModelNotFound` unless `name` is one of `served_names` (the served id first, then aliases)."""
    if name not in served_names:
        raise ModelNotFound(f"model {clipped(name)!r} is not served here; use {served_names[0]!r}")


def validate_common(body: _SamplingFields, vocab_size: int) -> None:
    """Combined-field rules of a text completion body (stops, observation, stream options, ``n``
    times a batch's prompts, ``best_of``)."""
    check_completion_options(body, vocab_size)
    prompt = getattr(body, "prompt", None)
    num_prompts = len(prompt) if _prompt_shape(prompt) in ("texts", "token_lists") else 1
    if (body.n or 1) * num_prompts > MAX_CHOICES:
        raise ChatOptionError(f"n ({body.n}) times the number of prompts ({num_prompts}) may be at most {MAX_CHOICES}",
                              "n")
    best_of = getattr(body, "best_of", None)
    if best_of is not None and best_of != (body.n or 1):
        raise ChatOptionError("best_of is accepted only equal to n (Helios returns every choice it samples)", "best_of")


def validate_chat(body: ChatCompletionRequest, vocab_size: int) -> None:
    """Combined-field rules of a chat body: those of `validate_common` plus output-limit aliases,
    stops with structured output, and tool choice (request preparation applies these too); and each
    message's count bounds (see the module docstring)."""
    check_chat_options(body, vocab_size)
    for index, message in enumerate(body.messages):
        check_message_counts(message, index)


def check_message_counts(message: Message, index: int) -> None:
    """`TooManyParts` for a message (`index` in the body) of more than `MAX_TEXT_PARTS` text parts or
    `MAX_TOOL_CALLS` tool calls."""
    content = message.content
    num_texts = sum(isinstance(part, TextPart) for part in content) if isinstance(content, list) else 0
    if num_texts > MAX_TEXT_PARTS:
        raise TooManyParts(f"messages[{index}].content has {num_texts} text parts; a message may have at most "
                           f"{MAX_TEXT_PARTS} (join texts into fewer parts)", f"messages[{index}].content")
    num_calls = len(getattr(message, "tool_calls", None) or ())
    if num_calls > MAX_TOOL_CALLS:
        raise TooManyParts(f"messages[{index}].tool_calls has {num_calls} calls; an assistant message may have at "
                           f"most {MAX_TOOL_CALLS}", f"messages[{index}].tool_calls")
