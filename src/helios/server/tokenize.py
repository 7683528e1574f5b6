"""vLLM's tokenizer endpoints: ``POST /tokenize``, ``POST /detokenize`` and ``GET /version``.

``/tokenize`` answers ``{"count", "max_model_len", "tokens"}`` (and ``token_strs``, each id's
vocabulary string, with ``return_token_strs``) for

- a text (``prompt``): its ids as a ``/v1/completions`` prompt of that text has them (the
  tokenizer's special tokens added unless ``add_special_tokens`` is false);
- a chat (``messages``, with ``tools``, ``chat_template_kwargs``, ``add_generation_prompt`` and
  ``continue_final_message``): the ids of the prompt a ``/v1/chat/completions`` request of those
  fields has, rendered by the same method (`FrontendModel.chat_prompt`: the same validation,
  control-marker escaping and image placeholders expanded to their features), so ``count`` is
  that request's ``usage.prompt_tokens``. With ``add_special_tokens`` (default false, as the
  template writes its own) the tokenizer's post-processor tokens are added around them.

A prompt longer than the context is counted all the same (as vLLM counts it): ``count`` against
``max_model_len`` is how a client finds how much to cut. Text that no prompt of the context could
hold (`helios.frontend.decoding.text_bounds`: more code points than the context's tokens can spell)
is refused before it is tokenized, with the 400 (`PromptTooLong`) a completion of it gets: the
tokenizer takes tens of seconds over the megabytes a body may hold, a thread the preparation time
bound cannot stop, holding a preparation slot that chat requests wait for. So the work is bounded
by that text bound, the schema's counts, the template's CPU bound and the preparation time bound.

``/detokenize`` answers ``{"prompt"}``: the ids' text as the tokenizer decodes it, special tokens
kept (transformers' ``decode``; cleaned up on a core that cleans up tokenization spaces, as an echo
is). An id outside the tokenizer's vocabulary is a `TokenOutOfVocabulary` (400) naming it.

Both run their rendering, tokenizing and decoding, and the encoding of the answer (a long text holds
hundreds of thousands of ids), in a preparation slot (`helios.server.preparation`), off the event
loop, beside chat preparation. Neither takes an admission permit: they never reach the model worker.
"""

from __future__ import annotations

import json
from typing import Sequence

from starlette.responses import Response

from helios import __version__
from helios.errors import RequestError
from helios.frontend.preparation.request_options import tool_names
from helios.frontend.session import FrontendModel
from helios.server.schemas import check_message_counts, check_model
from helios.server.schemas_tokenize import DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest
from helios.server.service import ServedModel

# A text the post-processor's special tokens are read around (`special_tokens_around`).
_PROBE = "a"


class TokenOutOfVocabulary(RequestError):
    """A ``/detokenize`` id the tokenizer has no token for."""

    param = "tokens"


class NoSpecialTokenPlaces(RequestError):
    """A tokenizer whose post-processor changes a text's own ids, so the special tokens it adds
    cannot be placed around a chat prompt's ids."""

    param = "add_special_tokens"


async def respond_tokenize(served: ServedModel, body: TokenizeCompletionRequest | TokenizeChatRequest) -> Response:
    """The ``/tokenize`` answer of `body` (module docstring); RequestError subclasses are 400s."""
    _check_named_model(body.model, served)
    tokenize = tokenize_chat if isinstance(body, TokenizeChatRequest) else tokenize_text
    return await served.preparation.run(_answer_tokens, tokenize, served.frontend, body,
                                        served.card.context_tokens, compiles=False)


async def respond_detokenize(served: ServedModel, body: DetokenizeRequest) -> Response:
    """The ``/detokenize`` answer of `body`: ``{"prompt": text}``."""
    _check_named_model(body.model, served)
    return await served.preparation.run(_answer_text, served.frontend, body.tokens, compiles=False)


def version() -> dict:
    """``GET /version``: this server's version, as vLLM's endpoint of that name answers it."""
    return {"version": __version__}


def _check_named_model(name: str | None, served: ServedModel) -> None:
    if name is not None:  # left out: the one model served here
        check_model(name, served.card.served_names)


def _answer_tokens(tokenize, frontend: FrontendModel, body, context_tokens: int) -> Response:
    ids = tokenize(frontend, body)
    answer = {"count": len(ids), "max_model_len": context_tokens, "tokens": list(ids)}
    if body.return_token_strs:
        answer["token_strs"] = [frontend.tokenizer.id_to_token(token) for token in ids]
    return _json(answer)


def _answer_text(frontend: FrontendModel, token_ids: Sequence[int]) -> Response:
    return _json({"prompt": detokenize(frontend, token_ids)})


def _json(content: dict) -> Response:
    """`content` encoded as Starlette's `JSONResponse` encodes it, here in the preparation thread."""
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(text.encode("utf-8"), media_type="application/json")


def tokenize_text(frontend: FrontendModel, body: TokenizeCompletionRequest) -> tuple[int, ...]:
    """`body.prompt`'s ids, as `FrontendModel.prepare_completion` tokenizes a text prompt."""
    return frontend.text_prompt(body.prompt, body.add_special_tokens)


def tokenize_chat(frontend: FrontendModel, body: TokenizeChatRequest) -> tuple[int, ...]:
    """The prompt ids of a chat completion of `body`'s fields (`FrontendModel.chat_prompt`, tools
    rendered where any are declared), without the output limit that refuses a prompt the context
    cannot hold with room for output, and with the post-processor's special tokens where
    `body.add_special_tokens`."""
    for index, message in enumerate(body.messages):
        check_message_counts(message, index)
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if tool_names(body) else None
    prompt, _ = frontend.chat_prompt(body, tools)
    if not body.add_special_tokens:
        return prompt.token_ids
    before, after = special_tokens_around(frontend.tokenizer)
    return (*before, *prompt.token_ids, *after)


def special_tokens_around(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids `tokenizer`'s post-processor adds before and after a text's own (Llama's BOS; none
    without a post-processor), read from a probe text encoded with and without them.
    `NoSpecialTokenPlaces` where the probe's own ids are not a run of the processed ones."""
    bare = tokenizer.encode(_PROBE, add_special_tokens=False).ids
    full = tokenizer.encode(_PROBE, add_special_tokens=True).ids
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            return tuple(full[:start]), tuple(full[start + len(bare):])
    raise NoSpecialTokenPlaces("this model's tokenizer post-processing changes a text's own tokens, so its special "
                               "tokens cannot be added to a chat prompt; leave add_special_tokens out")


def detokenize(frontend: FrontendModel, token_ids: Sequence[int]) -> str:
    """The text of `token_ids` (special tokens kept), as an echoed id prompt's text; `TokenOutOfVocabulary`
    for the first id the tokenizer has no token for."""
    tokenizer = frontend.tokenizer
    # each distinct id looked up once: at most the vocabulary's size of lookups however long the list
    unknown = {token for token in set(token_ids) if token >= 2**32 or tokenizer.id_to_token(token) is None}
    if unknown:
        index, token = next((i, token) for i, token in enumerate(token_ids) if token in unknown)
        raise TokenOutOfVocabulary(
            f"tokens[{index}] ({clipped_id(token)}) is not an id of this model's vocabulary "
            f"({tokenizer.get_vocab_size(with_added_tokens=True)} tokens)", f"tokens[{index}]")
    return frontend.decode_ids(token_ids)


def clipped_id(token: int) -> str:
    """An id as an error message writes it: a client's 4,000-digit integer is not echoed whole."""
    text = str(token)
    return text if len(text) <= 20 else f"{text[:20]}... ({len(text)} digits)"
