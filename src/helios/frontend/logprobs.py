"""Token log-probabilities: the request fields, the texts of scored tokens, and OpenAI's shapes.

Fields (`requested_logprobs`): chat takes ``logprobs: true`` and ``top_logprobs`` (0..20
alternatives per token; a nonzero ``top_logprobs`` needs ``logprobs: true``); text completions take
``logprobs`` as the number of alternatives (0..20). ``logprobs: false``/``null`` and
``top_logprobs: null`` ask for nothing. The values come from the device (`helios.abi.token_logprobs`):
the distribution each token was drawn from after penalties and the grammar mask, before temperature
and the top-k/top-p/min-p filters, so greedy rows get exactly ``log_softmax`` of the logits.

Which tokens: every generated token the output shows or cuts, in order; EOS tokens (never shown)
and tokens after a matched stop are left out. A token's text is its id decoded alone (special
tokens kept); ``bytes`` are that text's UTF-8 bytes.

Shapes: chat ``choices[].logprobs = {"content": [{"token", "logprob", "bytes", "top_logprobs":
[{"token", "logprob", "bytes"}]}], "refusal": null}``; text completions ``choices[].logprobs =
{"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}``. Streamed chunks
carry the entries of the tokens they deliver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from helios.errors import RequestError
from helios.runtime.events import TokenLogprobs

MAX_TOP_LOGPROBS = 20


class LogprobsOptionError(RequestError):
    """``top_logprobs`` without ``logprobs: true``."""


class LogprobsUnavailable(RequestError):
    """The core was prepared without token-logprobs programs, so it cannot return log-probabilities."""


def requested_logprobs(body: Any, is_chat: bool) -> int | None:
    """Alternatives per token the body asks for, or None when it asks for no log-probabilities."""
    if not is_chat:
        return body.logprobs
    top = getattr(body, "top_logprobs", None)
    if body.logprobs is not True:
        if top:
            raise LogprobsOptionError("top_logprobs needs logprobs: true")
        return None
    return top or 0


def check_logprobs_capability(requested: int | None, available: int) -> None:
    """`LogprobsUnavailable` when a request asks for log-probabilities the core cannot compute."""
    if requested is None:
        return
    if not available:
        raise LogprobsUnavailable(
            "this core has no token-logprobs programs (it was prepared without them, by an older helios or "
            "with --no-logprobs), so it cannot return logprobs; prepare it again to serve them")
    if requested > available:
        raise LogprobsUnavailable(f"this core returns at most {available} top_logprobs per token")


@dataclass(frozen=True, slots=True)
class LogprobEntry:
    """One generated token's text and log-probability, with its alternatives (text, logprob)."""

    text: str
    logprob: float
    top: tuple[tuple[str, float], ...]


class TokenTexts:
    """Each token id's text decoded alone (cached); shared by the requests of one model."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.text = lru_cache(maxsize=65536)(self._decode)

    def _decode(self, token_id: int) -> str:
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def entry(self, token_id: int, values: TokenLogprobs) -> LogprobEntry:
        top = tuple((self.text(alt), value) for alt, value in values.top)
        return LogprobEntry(self.text(token_id), values.logprob, top)


def _number(value: float) -> float:
    """JSON has no -inf: a token the mask removed reports the most negative finite float."""
    return value if math.isfinite(value) else -3.4028234663852886e38


def _chat_item(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": _number(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: Sequence[LogprobEntry]) -> dict:
    """A chat choice's (or chunk's) ``logprobs`` object."""
    content = []
    for entry in entries:
        item = _chat_item(entry.text, entry.logprob)
        item["top_logprobs"] = [_chat_item(text, value) for text, value in entry.top]
        content.append(item)
    return {"content": content, "refusal": None}


def text_logprobs(entries: Sequence[LogprobEntry], text_offset: int = 0) -> dict:
    """A text completion choice's (or chunk's) ``logprobs`` object; offsets start at `text_offset`."""
    offsets = []
    for entry in entries:
        offsets.append(text_offset)
        text_offset += len(entry.text)
    top = []
    for entry in entries:
        alternatives: dict[str, float] = {}
        for text, value in entry.top:
            alternatives.setdefault(text, _number(value))  # two ids may decode alike: the likelier wins
        top.append(alternatives)
    return {"tokens": [e.text for e in entries], "token_logprobs": [_number(e.logprob) for e in entries],
            "top_logprobs": top, "text_offset": offsets}
