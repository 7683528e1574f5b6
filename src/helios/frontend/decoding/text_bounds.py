"""Bounds on request text checked before any template rendering or tokenizing.

Tokenizing costs time and memory in proportion to the text, so a request whose text cannot fit the
context extent is refused before it is tokenized. The bound is derived, not guessed: no token of the
vocabulary covers more than `max_token_chars` code points of input (the longest token string; a
byte-level token spells one byte per character, and a code point is at least one byte), so a text of
more than ``context_tokens * max_token_chars`` code points needs more tokens than the context holds
(rendering a chat template only adds text). This assumes the tokenizer's normalizer does not drop
input, which none of the supported tokenizers does.

Text must also be Unicode: a lone surrogate (valid in a JSON escape, or from a command line decoded
with ``surrogateescape``) cannot be encoded, and the tokenizer would fail on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from helios.errors import RequestError


class PromptTooLong(RequestError):
    """The request's text is longer than any prompt the context extent can hold: it can never fit,
    so HTTP 400 (like a tokenized prompt beyond the context extent)."""


class TextNotUnicode(RequestError):
    """Request text holding a lone surrogate (not encodable as UTF-8)."""


@dataclass(frozen=True)
class TextBounds:
    """`max_text_chars`: the most code points of request text that can fit the context extent."""

    max_text_chars: int
    context_tokens: int

    @classmethod
    def from_tokenizer(cls, tokenizer, context_tokens: int) -> TextBounds:
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        max_token_chars = max((len(token) for token in vocab), default=1)
        return cls(context_tokens * max(1, max_token_chars), context_tokens)

    def check(self, texts: Iterable[str], param: str | None = None) -> None:
        """Raises `TextNotUnicode` or `PromptTooLong` for the request's texts (all of them);
        `param`: the request field `PromptTooLong` names."""
        total = 0
        for text in texts:
            check_unicode(text)
            total += len(text)
            if total > self.max_text_chars:
                raise PromptTooLong(
                    f"the request text is more than {self.max_text_chars} characters, longer than any "
                    f"prompt that fits the context extent of {self.context_tokens} tokens", param)


def is_unicode_text(text: str) -> bool:
    """Whether `text` encodes to UTF-8 (a lone surrogate, valid in a JSON escape, does not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise TextNotUnicode(
            f"the request text holds a lone surrogate (\\u{ord(text[error.start]):04x}); send Unicode text"
        ) from None


def strings_of(value: object) -> Iterable[str]:
    """Every string (keys and values) inside a JSON-like value, iteratively."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str):
                    yield key
                stack.append(child)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
