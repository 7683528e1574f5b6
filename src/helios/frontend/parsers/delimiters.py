"""Single-token delimiters: which spellings the tokenizer encodes as one token, and their ids.

The feeding contract shared by every parser here: ``feed(token_id, text)`` receives the text of one
or more consecutive generated tokens, ending with the token ``token_id``. Consecutive tokens may be
fed together and a token's text may arrive with a later token (the detokenizer holds incomplete
characters back), but a token whose id is registered here must be the last token of its feed. Its
text, when the detokenizer produced it, is the end of that feed. This is how a parser tells a
delimiter generated as its token from the same spelling generated as plain text pieces.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, NamedTuple, Sequence


class TokenDelimiters:
    """Spelling <-> token id for the delimiters the tokenizer encodes as a single token.

    Immutable after construction and shared read-only by the parsers of many requests.
    """

    def __init__(self, ids: Mapping[str, int] | None = None):
        self._by_text = dict(ids or {})
        self._by_id = {token_id: text for text, token_id in self._by_text.items()}
        if len(self._by_id) != len(self._by_text):
            raise ValueError("two delimiters share one token id")

    @classmethod
    def from_encoder(cls, spellings: Iterable[str], encode: Callable[[str], Sequence[int]]) -> "TokenDelimiters":
        """Registers each spelling that ``encode`` (the frontend tokenizer, no special prefix
        tokens) turns into exactly one token."""
        ids = {}
        for text in spellings:
            token_ids = list(encode(text))
            if len(token_ids) == 1:
                ids[text] = token_ids[0]
        return cls(ids)

    def id_of(self, text: str) -> int | None:
        return self._by_text.get(text)

    def text_of(self, token_id: int) -> str | None:
        return self._by_id.get(token_id)

    def is_single_token(self, text: str) -> bool:
        return text in self._by_text


class TokenFeed(NamedTuple):
    """A feed split at its closing delimiter token: ``before`` is ordinary text; ``delimiter`` is
    the delimiter spelling when ``token_id`` is a registered delimiter (else None); ``markup`` is
    the part of the fed text that spelled it ("" when the detokenizer produced no text for it)."""

    before: str
    delimiter: str | None
    markup: str


def split_feed(delimiters: TokenDelimiters, token_id: int, text: str) -> TokenFeed:
    spelling = delimiters.text_of(token_id)
    if spelling is None:
        return TokenFeed(text, None, "")
    if text.endswith(spelling):
        return TokenFeed(text[: len(text) - len(spelling)], spelling, spelling)
    return TokenFeed(text, spelling, "")
