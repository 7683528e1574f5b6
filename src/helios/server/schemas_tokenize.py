"""Request bodies of vLLM's tokenizer endpoints (``POST /tokenize``, ``POST /detokenize``), strict as
`helios.server.schemas`'s: unknown fields are rejected, types are strict and every list is bounded.

A tokenize body is a text (``prompt``) or a chat (``messages``), told apart by which of the two it
holds (`TokenizeRequest`); the chat form takes the chat completion's own message, tool and template
argument types and bounds, so a conversation a chat completion accepts tokenizes, and one it
refuses is refused here with the same error. ``model`` may be left out (as vLLM allows): the served
model is the only one.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, Discriminator, Field, StrictBool, StrictStr, Tag

from helios.server.schemas import (
    MAX_MESSAGES, MAX_TEMPLATE_KWARGS, MAX_TOOLS, Message, StrictInt, Tool, list_of, StrictModel,
)

MAX_DETOKENIZE_TOKENS = 1 << 20  # ids of one /detokenize body (more than any context; a 4 MiB body holds 2M)

_RETURN_TOKEN_STRS = "Also return each token's vocabulary string (`token_strs`)"


class TokenizeCompletionRequest(StrictModel):
    """A text, tokenized as a ``/v1/completions`` prompt is."""

    model: StrictStr | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = Field(
        default=True, description="Add the tokenizer's special tokens (BOS, ...), as a completion prompt gets them")
    return_token_strs: StrictBool | None = Field(default=None, description=_RETURN_TOKEN_STRS)


class TokenizeChatRequest(StrictModel):
    """A conversation, rendered and tokenized as a ``/v1/chat/completions`` prompt is."""

    model: StrictStr | None = None
    messages: list_of(Message, MAX_MESSAGES, min_len=1)
    tools: list_of(Tool, MAX_TOOLS) | None = Field(default=None, description="Rendered as a chat completion's tools")
    chat_template_kwargs: dict[str, Union[StrictBool, StrictInt, float, StrictStr, None]] | None = Field(
        default=None, max_length=MAX_TEMPLATE_KWARGS, description="Extra chat template arguments, as a chat "
        "completion takes them")
    add_generation_prompt: StrictBool | None = Field(
        default=None, description="End the prompt with the assistant turn's header (default: true, false with "
        "continue_final_message)")
    continue_final_message: StrictBool | None = Field(
        default=None, description="Leave the final (assistant) message open, as a chat completion's prefill")
    add_special_tokens: StrictBool = Field(
        default=False, description="Add the tokenizer's special tokens (BOS, ...) around what the chat template "
        "renders (which writes its own; a chat completion's prompt adds none)")
    return_token_strs: StrictBool | None = Field(default=None, description=_RETURN_TOKEN_STRS)


def _tokenize_form(value: Any) -> str | None:
    """The `TokenizeRequest` member a body is: a chat with ``messages``, a text with ``prompt``; None
    (the `TOKENIZE_FORMS` error) for both or neither. A member already validated is its own form
    (FastAPI validates again the model a large body was validated to off the event loop:
    `helios.server.app.ParsedBodyRoute`)."""
    if isinstance(value, (TokenizeChatRequest, TokenizeCompletionRequest)):
        return "chat" if isinstance(value, TokenizeChatRequest) else "text"
    if not isinstance(value, dict) or ("messages" in value) == ("prompt" in value):
        return None
    return "chat" if "messages" in value else "text"


TOKENIZE_FORMS = "a tokenize body holds either prompt (a text) or messages (a chat), exactly one of them"


TokenizeRequest = Annotated[Union[
    Annotated[TokenizeCompletionRequest, Tag("text")],
    Annotated[TokenizeChatRequest, Tag("chat")],
], Discriminator(_tokenize_form, custom_error_type="tokenize_form", custom_error_message=TOKENIZE_FORMS)]


class DetokenizeRequest(StrictModel):
    model: StrictStr | None = None
    tokens: list_of(Annotated[StrictInt, Field(ge=0)], MAX_DETOKENIZE_TOKENS) = Field(
        description=f"Token ids of the tokenizer's vocabulary (at most {MAX_DETOKENIZE_TOKENS})")


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int = Field(description="The served context extent (a longer prompt is counted all the same)")
    tokens: list[int]
    token_strs: list[str] | None = Field(default=None, description="With return_token_strs only")


class DetokenizeResponse(BaseModel):
    prompt: str
