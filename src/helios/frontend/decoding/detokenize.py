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

A run of stray bytes (bytes that start no character, or start one cut short) keeps the decoded text
ending in U+FFFD, so its ids stay pending; decoding the whole growing window on each id would cost
quadratic time. Once the pending ids hold `SETTLE_IDS` more ids than that, the text of the older ones
is settled: the window decodes from the last `SETTLE_IDS` ids (the live window) and the text before
it is kept. A split is taken only where no later id can change the text before it: the whole window's
text ends with the live window's, which holds at least 4 characters (UTF-8 resynchronises within a
character's 4 bytes), and the live window's text still ends in U+FFFD without each of its last 3 ids
(so its open byte group is invalid wherever it ends, not a valid start with a character cut short: a
byte-fallback decoder spells an invalid group as one U+FFFD per byte however long it grows). Each id
is then decoded a bounded number of times.
"""

from __future__ import annotations

from typing import Protocol, Sequence

REPLACEMENT_CHAR = "\ufffd"
CONTEXT_IDS = 5  # context ids a detokenizer keeps (vLLM's initial offset): a few tokens of text before the output
SETTLE_IDS = 8  # ids a live window keeps when pending text is settled (it is tried at twice this many)
MIN_LIVE_CHARS = 4  # a UTF-8 character's most bytes: the live window's text holds at least this many characters


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
        self._open_text = ""  # the pending ids' text (ends in U+FFFD), "" when none are pending (unsettled)
        self._finished = False
        self._prefix_text: str | None = None  # decode of ids[prefix_offset:read_offset], cached until they move
        # Settled pending text (see the module docstring): ids[read_offset:live_start] read as the
        # pieces, then ids[live_start:] decode to the live text. live_start == prefix_offset: unsettled.
        self._settled: list[str] = []
        self._live_start = self._prefix_offset
        self._live_text = ""
        self._next_settle = 0  # ids in the live window at the next settling try

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
        no id is pending); it holds any complete character before the open one. Built on each call
        (as long as the pending text): a caller reading it per id reads `settled_pieces` instead."""
        if self._settled:
            return "".join(self._settled) + self._live_text
        return self._open_text

    @property
    def unsettled_open_text(self) -> str:
        """The part of `open_text` after its settled pieces (all of it when none is settled)."""
        return self._live_text if self._settled else self._open_text

    @property
    def num_settled_pieces(self) -> int:
        """Pieces of settled pending text so far (`settled_pieces`); 0 when none is settled."""
        return len(self._settled)

    def settled_pieces(self, start: int = 0) -> list[str]:
        """The settled pieces from `start` on: joined, all of them begin `open_text` and no later id
        changes them while the ids stay pending (they are dropped when the text is emitted)."""
        return self._settled[start:]

    def feed(self, token_id: int) -> str:
        """Adds one generated id and returns the newly complete text ("" while a character is open)."""
        if self._finished:
            raise ValueError("feed after finish")
        self._num_tokens += 1
        self._ids.append(token_id)
        if self._settled:
            return self._feed_settled()
        prefix_text = self._prefix()
        new_text = self._decode(self._prefix_offset, len(self._ids))
        if new_text.endswith(REPLACEMENT_CHAR):
            self._open_text = new_text[len(prefix_text) :]
            self._try_settle(new_text, prefix_text)
            return ""
        if len(new_text) <= len(prefix_text):
            if self._is_skipped_special(token_id):  # decodes to nothing anywhere: leave it out of later windows
                self._ids.pop()
            # Otherwise it stays pending: a SentencePiece ``▁`` first in the text reads as nothing
            # alone but keeps the space of the word after it.
            return ""
        self._emitted()
        return new_text[len(prefix_text) :]

    def _feed_settled(self) -> str:
        """`feed` once some pending text is settled: only the live window is decoded."""
        live_text = self._decode(self._live_start, len(self._ids))
        self._live_text = live_text
        if live_text.endswith(REPLACEMENT_CHAR) or not live_text:
            self._try_settle(live_text, "")
            return ""
        delta = "".join(self._settled) + live_text
        self._emitted()
        return delta

    def _emitted(self) -> None:
        """The pending ids' text was emitted: they become the next window's prefix."""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._prefix_text = None
        self._open_text = ""
        self._settled = []
        self._live_start, self._live_text, self._next_settle = self._prefix_offset, "", 0

    def _try_settle(self, window_text: str, prefix_text: str) -> None:
        """Settles the text of all but the last `SETTLE_IDS` ids of a long live window (whose text,
        `window_text`, begins with `prefix_text`) where no later id can change it (module docstring)."""
        live_ids = len(self._ids) - self._live_start
        if live_ids < max(2 * SETTLE_IDS, self._next_settle):
            return
        start = len(self._ids) - SETTLE_IDS
        if start <= self._read_offset:
            return
        self._next_settle = live_ids + SETTLE_IDS  # where this try fails, the next waits for more ids
        live_text = self._decode(start, len(self._ids))
        if len(live_text) < MIN_LIVE_CHARS or not window_text.endswith(live_text):
            return
        before = window_text[: len(window_text) - len(live_text)]
        if len(before) < len(prefix_text) or not before.startswith(prefix_text):
            return
        if not all(self._decode(start, len(self._ids) - cut).endswith(REPLACEMENT_CHAR) for cut in (1, 2, 3)):
            return
        piece = before[len(prefix_text) :]
        self._settled.append(piece)
        self._live_start, self._live_text, self._next_settle = start, live_text, 0
        self._open_text = ""

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
        if self._settled:
            tail = "".join(self._settled) + self._decode(self._live_start, len(self._ids))
        else:
            tail = self._decode(self._prefix_offset, len(self._ids))[len(self._prefix()) :]
        self._emitted()
        return tail

    def _is_skipped_special(self, token_id: int) -> bool:
        """Whether `token_id` is a special token that skipping removes from every decode."""
        return (self._skip_special_tokens and not self._tokenizer.decode([token_id], skip_special_tokens=True)
                and bool(self._tokenizer.decode([token_id], skip_special_tokens=False)))

    def _prefix(self) -> str:
        """The emitted window's text (ids[prefix_offset:read_offset]), decoded once per window."""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        return self._prefix_text

    def _decode(self, start: int, end: int) -> str:
        if start == end:
            return ""
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip_special_tokens)
