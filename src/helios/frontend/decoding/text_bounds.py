"""Bounds on request text checked before any template rendering or tokenizing.

Tokenizing costs time and memory in proportion to the text, so a request whose text cannot fit the
context extent is refused before it is tokenized. The bound is derived, not guessed: no token of the
vocabulary covers more than `max_token_chars` code points of input (the longest token string; a
byte-level token spells one byte per character, and a code point is at least one byte), so a text of
more than ``context_tokens * max_token_chars`` code points needs more tokens than the context holds
(rendering a chat template only adds text).

A tokenizer can read more text than its tokens spell, and the bound allows for what it reads of its
configuration (`_reach`): a composing normalizer (NFC, NFKC) spells up to `MAX_COMPOSED` code points
as one, a ``Replace`` with shorter text a pattern as its content; white space that an added token's
lstrip/rstrip, a ``Strip`` normalizer or a white-space pre-tokenizer can drop is not counted (any
amount of it may cost no token); and where a component can drop any other text (a normalizer that
removes accents or control characters, or replaces text by nothing or by a pattern, a pre-tokenizer
that removes what it splits on, a model that reads a run of unknown characters as one token, or a
component it does not know) there is no bound: the prompt is refused only once tokenized.

Text must also be Unicode: a lone surrogate (valid in a JSON escape, or from a command line decoded
with ``surrogateescape``) cannot be encoded, and the tokenizer would fail on it.
"""

from __future__ import annotations

import json
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
    """`max_text_chars`: the most code points of request text that can fit the context extent (None:
    no bound); white space is not counted unless `counts_space`."""

    max_text_chars: int | None
    context_tokens: int
    counts_space: bool = True

    @classmethod
    def from_tokenizer(cls, tokenizer, context_tokens: int) -> TextBounds:
        reach = _reach(tokenizer)
        if reach is None:
            return cls(None, context_tokens)
        chars_per_token, drops_space = reach
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        max_token_chars = max((len(token) for token in vocab), default=1)
        return cls(context_tokens * max(1, max_token_chars) * chars_per_token, context_tokens, not drops_space)

    def check(self, texts: Iterable[str], param: str | None = None) -> None:
        """Raises `TextNotUnicode` or `PromptTooLong` for the request's texts (all of them);
        `param`: the request field `PromptTooLong` names."""
        total = 0
        for text in texts:
            check_unicode(text)
            if self.max_text_chars is None:
                continue
            total += len(text) if self.counts_space else sum(map(len, text.split()))
            if total > self.max_text_chars:
                counted = "" if self.counts_space else " other than white space"
                raise PromptTooLong(
                    f"the request text is more than {self.max_text_chars} characters{counted}, longer than any "
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


MAX_COMPOSED = 4  # the most code points canonical composition spells as one (U+1F82: alpha and three marks)
_KEEPS_TEXT = {"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"}  # normalizers that drop and merge nothing
_SPLITS_KEEPING = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}  # pre-tokenizers that drop nothing
_SPLITS_DROPPING_SPACE = {"Whitespace", "WhitespaceSplit", "BertPreTokenizer"}


def _reach(tokenizer) -> tuple[int, bool] | None:
    """How many code points of input one character of token text can stand for, and whether any
    amount of white space can be dropped; None where other text can be dropped (module docstring).
    Reads the normalizer and pre-tokenizer as they serialize, the model's unknown-token handling and
    the added tokens' lstrip/rstrip."""
    normalizer = _component(tokenizer, "normalizer")
    pre_tokenizer = _component(tokenizer, "pre_tokenizer")
    if (normalizer is False or pre_tokenizer is False
            or _fuses_unknown(getattr(tokenizer, "model", None), _is_byte_level(pre_tokenizer))):
        return None
    reach = _normalizer_reach(normalizer) if normalizer else (1, False)
    splits = _pre_tokenizer_drops_space(pre_tokenizer) if pre_tokenizer else False
    if reach is None or splits is None:
        return None
    added = tokenizer.get_added_tokens_decoder().values() if hasattr(tokenizer, "get_added_tokens_decoder") else ()
    strips = any(token.lstrip or token.rstrip for token in added)
    return reach[0], reach[1] or splits or strips


def _component(tokenizer, name: str) -> dict | None | bool:
    """A tokenizer component's serialized form; None where there is none, False where it does not
    serialize (a custom Python component)."""
    component = getattr(tokenizer, name, None)
    if component is None:
        return None
    try:
        return json.loads(component.__getstate__())
    except Exception:  # a custom component (Python) has no serialized form
        return False


def _normalizer_reach(spec: dict) -> tuple[int, bool] | None:
    """`_reach` of a normalizer's serialized form."""
    kind = spec.get("type")
    if kind == "Sequence":
        chars, drops_space = 1, False
        for part in spec.get("normalizers", ()):
            reach = _normalizer_reach(part)
            if reach is None:
                return None
            chars, drops_space = chars * reach[0], drops_space or reach[1]
        return chars, drops_space
    if kind in _KEEPS_TEXT:
        return 1, False
    if kind in ("NFC", "NFKC"):
        return MAX_COMPOSED, False
    if kind == "Strip":
        return 1, True
    if kind == "Replace":
        pattern, content = spec.get("pattern", {}).get("String"), spec.get("content", "")
        if not pattern:  # a regular expression: no bound on what it matches
            return None
        if not content:
            return (1, True) if pattern.isspace() else None
        return -(-len(pattern) // len(content)), False
    return None  # StripAccents, BertNormalizer, Nmt, Precompiled (a charsmap) and others drop characters


def _pre_tokenizer_drops_space(spec: dict) -> bool | None:
    """Whether a pre-tokenizer (serialized) drops white space; None where it can drop other text."""
    kind = spec.get("type")
    if kind == "Sequence":
        drops = [_pre_tokenizer_drops_space(part) for part in spec.get("pretokenizers", ())]
        return None if None in drops else any(drops)
    if kind in _SPLITS_KEEPING:
        return False
    if kind in _SPLITS_DROPPING_SPACE:
        return True
    if kind in ("Split", "Punctuation"):
        return None if spec.get("behavior") == "Removed" else False
    if kind == "CharDelimiterSplit":
        return True if spec.get("delimiter", "").isspace() else None
    return None


def _fuses_unknown(model, byte_level: bool = False) -> bool:
    """Whether the model can read a run of characters of any length as one token (or as none): an
    unknown word (WordPiece, WordLevel), fused unknown characters (BPE with fuse_unk, Unigram) where
    no byte fallback spells them, or a BPE without an unknown token, which drops characters it lacks
    (unless a byte-level pre-tokenizer spells every character in bytes it has)."""
    if model is None:
        return False
    kind = type(model).__name__
    if kind in ("WordPiece", "WordLevel"):
        return True
    if kind == "BPE":
        if not model.unk_token:
            return not byte_level and not _falls_back_to_bytes(model)
        return model.fuse_unk and not _falls_back_to_bytes(model)
    if kind == "Unigram":
        state = json.loads(model.__getstate__())
        return state.get("unk_id") is not None and not (state.get("byte_fallback") and _falls_back_to_bytes(model))
    return False


def _is_byte_level(spec: dict | None) -> bool:
    """Whether a pre-tokenizer (serialized) maps text to byte-level characters (GPT-2's alphabet)."""
    if not spec:
        return False
    if spec.get("type") == "Sequence":
        return any(_is_byte_level(part) for part in spec.get("pretokenizers", ()))
    return spec.get("type") == "ByteLevel"


def _falls_back_to_bytes(model) -> bool:
    """Whether unknown characters become byte tokens: byte fallback on and every ``<0xNN>`` a token."""
    if not getattr(model, "byte_fallback", True):
        return False
    return all(model.token_to_id(f"<0x{byte:02X}>") is not None for byte in range(256))
