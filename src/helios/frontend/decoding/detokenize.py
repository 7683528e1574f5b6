"""Incremental detokenization: generated token ids in, text deltas out.

One `IncrementalDetokenizer` serves one request's output and is used by one thread. It owns the ids
fed so far and two offsets into them (the window scheme of TGI and vLLM):

- text decoded from ``ids[prefix_offset:read_offset]`` has already been emitted;
- each feed decodes ``ids[prefix_offset:]`` and emits what lies beyond that emitted prefix, unless
  the decoded text ends in U+FFFD, which is how the tokenizer's lossy UTF-8 decoding spells an
  incomplete trailing character; such text stays pending until a later token completes it.

The window restarts at the last emission and skipped special tokens (which decode to nothing
anywhere) are left out of it, so each feed decodes only a few tokens; decoders that treat the first
token of a sequence specially (leading-space stripping) see the same first token in both decodes;
another id that adds no text (a SentencePiece ``▁`` first in the text) stays pending. A detokenizer may
start after context ids (a text completion's prompt, its last `CONTEXT_IDS`), already read: the
first output token then decodes as it does after them, so a SentencePiece ``▁`` word keeps the
leading space it has in the text rather than losing it as the first token of a sequence (context
ending inside a character is not used). Invariants: a delta never ends inside a UTF-8 character,
emitted text is never emitted again, and the concatenation of every delta and `finish()` equals
``tokenizer.decode(all_ids, skip_special_tokens=...)`` (with context: what decoding the context and
all ids adds to the context's text).
"""

from __future__ import annotations

from typing import Protocol, Sequence

REPLACEMENT_CHAR = "\ufffd"
CONTEXT_IDS = 5  # context ids a detokenizer keeps (vLLM's initial offset): a few tokens of text before the output


class Decoder(Protocol):
    """The part of `tokenizers.Tokenizer` that detokenization needs."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas; see the module docstring for the invariants.

    `skip_special_tokens` follows `tokenizers`: tokens the tokenizer marks special decode to nothing
    when true and to their content when false. `context_ids`: ids before the output (their last
    `CONTEXT_IDS` are decoded with it, their text not emitted). Mutates only its own state;
    `tokenizer` is read-only.
    """

    def __init__(self, tokenizer: Decoder, *, skip_special_tokens: bool = True, context_ids: Sequence[int] = ()):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # the context, then the ids that produce text (ids that decode to nothing are dropped)
        self._ids: list[int] = self._usable_context(context_ids)
        self._num_tokens = 0
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._open_text = ""  # the pending ids' text (ends in U+FFFD), "" when none are pending
        self._finished = False

    def _usable_context(self, context_ids: Sequence[int]) -> list[int]:
        """The last `CONTEXT_IDS` of `context_ids`, or none where they hold no text but special
        tokens' (a lone BOS: the output starts the text) or end inside a character."""
        context = list(context_ids[-CONTEXT_IDS:])
        if not context or not self._tokenizer.decode(context, skip_special_tokens=True):
            return []
        decoded = self._tokenizer.decode(context, skip_special_tokens=self._skip_special_tokens)
        return [] if decoded.endswith(REPLACEMENT_CHAR) else context

    @property
    def num_tokens(self) -> int:
        """Ids fed so far."""
        return self._num_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Ids fed whose text has not been emitted yet (an incomplete UTF-8 character)."""
        return len(self._ids) - self._read_offset

    @property
    def open_text(self) -> str:
        """The text the pending ids decode to so far, ending in U+FFFD for the open character ("" when
        no id is pending); it holds any complete character before the open one."""
        return self._open_text

    def feed(self, token_id: int) -> str:
        """Adds one generated id and returns the newly complete text ("" while a character is open)."""
        if self._finished:
            raise ValueError("feed after finish")
        self._num_tokens += 1
        self._ids.append(token_id)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        if new_text.endswith(REPLACEMENT_CHAR):
            self._open_text = new_text[len(prefix_text) :]
            return ""
        if len(new_text) <= len(prefix_text):
            if self._is_skipped_special(token_id):  # decodes to nothing anywhere: leave it out of later windows
                self._ids.pop()
            # Otherwise it stays pending: a SentencePiece ``▁`` first in the text reads as nothing
            # alone but keeps the space of the word after it.
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._open_text = ""
        return new_text[len(prefix_text) :]

    def feed_many(self, token_ids: Sequence[int]) -> str:
        """Feeds several ids and returns their combined delta (same text as feeding one by one)."""
        return "".join(self.feed(token_id) for token_id in token_ids)

    def finish(self) -> str:
        """Ends the stream and returns pending text, with U+FFFD for any incomplete character.

        Called at EOS, output limit, stop or cancellation; the detokenizer accepts no ids after it.
        """
        if self._finished:
            return ""
        self._finished = True
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        self._read_offset = len(self._ids)
        self._open_text = ""
        return new_text[len(prefix_text) :]

    def _is_skipped_special(self, token_id: int) -> bool:
        """Whether `token_id` is a special token that skipping removes from every decode."""
        return (self._skip_special_tokens and not self._tokenizer.decode([token_id], skip_special_tokens=True)
                and bool(self._tokenizer.decode([token_id], skip_special_tokens=False)))

    def _decode(self, start: int, end: int) -> str:
        if start == end:
            return ""
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip_special_tokens)
