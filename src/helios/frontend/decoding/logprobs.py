"""Token log-probabilities: the request fields, the texts of scored tokens, and OpenAI's shapes.

Fields (`requested_logprobs`): chat takes ``logprobs: true`` and ``top_logprobs`` (0..20
alternatives per token; a nonzero ``top_logprobs`` needs ``logprobs: true``); text completions take
``logprobs`` as the number of alternatives (0..20). ``logprobs: false``/``null`` and
``top_logprobs: null`` ask for nothing. The values come from the device (`helios.abi.token_logprobs`):
the distribution each token was drawn from after penalties and the grammar mask, before temperature
and the top-k/top-p/min-p filters, so greedy rows get exactly ``log_softmax`` of the logits.

Which tokens: every generated token the output shows or cuts, in order; EOS tokens (never shown)
and tokens after a matched stop are left out. A token's text is its id decoded alone (special
tokens kept), so a token holding part of a UTF-8 character (a byte-fallback or byte-level token)
reads U+FFFD there, in chat ``token`` and in text completions' ``tokens`` alike (text
completions' ``text_offset`` still index the choice's ``text``: a split character counts once, for
the token holding its first byte, and a token whose text alone differs from its text in context,
such as a SentencePiece ``▁`` word that reads without its leading space alone, counts as the text
shows it, see `TextOffsets`; with ``echo``, each prompt token counts as its part of the echoed
prompt, `echoed_token_texts`, and the output's offsets continue after it). Chat ``bytes`` (of
the token and of each alternative) are the token's own raw bytes, as the tokenizer's vocabulary
spells them (`TokenTexts` takes them from the grammar's tokenizer), so the ``bytes`` of a choice's
content tokens, joined, decode to its text even where a character spans tokens, but for spaces the
decoder drops: a SentencePiece ``▁`` word's bytes hold its space (``▁Hello``: b" Hello", its
``token`` "Hello"), which the text lacks where the word starts it (the decoder strips the text's
first space), and a core that cleans up tokenization spaces removes some from the text; a token the
vocabulary cannot spell (outside the sampled range) falls back to its text's UTF-8.

Shapes: chat ``choices[].logprobs = {"content": [{"token", "logprob", "bytes", "top_logprobs":
[{"token", "logprob", "bytes"}]}], "refusal": null}``; text completions ``choices[].logprobs =
{"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}``. Streamed chunks
carry the entries of the tokens they deliver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, NamedTuple, Sequence

from helios.errors import RequestError
from helios.frontend.decoding.detokenize import REPLACEMENT_CHAR, Decoder, IncrementalDetokenizer, lossy_utf8
from helios.runtime.records.events import TokenLogprobs

MAX_TOP_LOGPROBS = 20


class LogprobsOptionError(RequestError):
    """``top_logprobs`` without ``logprobs: true`` (``param``: top_logprobs)."""

    param = "top_logprobs"


class LogprobsUnavailable(RequestError):
    """The core was prepared without token-logprobs programs, or with fewer alternatives than asked,
    so it cannot return the log-probabilities; `param` names the field that asked for them."""


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


def check_logprobs_capability(requested: int | None, available: int, is_chat: bool) -> None:
    """`LogprobsUnavailable` when a request asks for log-probabilities the core cannot compute."""
    if requested is None:
        return
    if not available:
        raise LogprobsUnavailable(
            "this core has no token-logprobs programs (it was prepared without them, by an older helios or "
            "with --no-logprobs), so it cannot return logprobs; prepare it again to serve them", "logprobs")
    if requested > available:
        field = "top_logprobs" if is_chat else "logprobs"  # the field that counts alternatives
        raise LogprobsUnavailable(f"this core returns at most {available} {field} per token", field)


class PromptScoresUnavailable(RequestError):
    """The core has no scored-prefill program, so it cannot score prompt tokens; `param` names the
    field that asked (``prompt_logprobs``, else ``echo``)."""


class EchoOptionError(RequestError):
    """``max_tokens: 0`` without ``echo`` or ``prompt_logprobs`` (nothing would be returned)."""

    param = "max_tokens"


@dataclass(frozen=True)
class PromptRequest:
    """What a body asks about its prompt: ``echo`` (completions: the prompt text before the
    output), the alternatives per echoed prompt token (``echo`` with ``logprobs``), vLLM's
    ``prompt_logprobs``, and ``max_tokens: 0`` (no output shown)."""

    echo: bool = False
    echo_logprobs: int | None = None
    prompt_logprobs: int | None = None
    hides_output: bool = False

    @property
    def scores(self) -> bool:
        """Whether the prompt runs through scored prefill."""
        return self.echo_logprobs is not None or self.prompt_logprobs is not None

    @property
    def num_top(self) -> int:
        return max(self.echo_logprobs or 0, self.prompt_logprobs or 0)


@dataclass(frozen=True)
class LogprobRequest:
    """Everything a body asks about log-probabilities: output tokens' alternatives (None: no
    output log-probabilities) and its `PromptRequest`."""

    top_logprobs: int | None = None
    prompt: PromptRequest = PromptRequest()


def requested_prompt(body: Any, is_chat: bool, scores_prompts: bool, is_vision: bool = False) -> PromptRequest:
    """The body's `PromptRequest`; a 400 for ``max_tokens: 0`` that would return nothing and for
    prompt scores a core without a scored-prefill program cannot compute. `is_vision`: the core has
    a vision contract, which preparation never gives a scored-prefill program (the 400 says so
    rather than naming a preparation option that refuses such a checkpoint)."""
    prompt_logprobs = getattr(body, "prompt_logprobs", None)
    if is_chat:
        request = PromptRequest(prompt_logprobs=prompt_logprobs)
    else:
        echo = body.echo is True
        request = PromptRequest(echo, body.logprobs if echo else None, prompt_logprobs, body.max_tokens == 0)
        if request.hides_output and not (echo or prompt_logprobs is not None):
            raise EchoOptionError("max_tokens 0 returns no output: it needs echo or prompt_logprobs")
    if request.scores and not scores_prompts:
        remedy = ("a vision-language core has none (helios prepare captures scored prefill for text-only "
                  "checkpoints alone)" if is_vision else "prepare it with --scored-prefill to serve them")
        raise PromptScoresUnavailable(
            "this core has no scored-prefill program, so it cannot return prompt log-probabilities (echo with "
            f"logprobs, prompt_logprobs); {remedy}",
            "prompt_logprobs" if prompt_logprobs is not None else "echo")
    return request


@dataclass(frozen=True)
class PromptScoring:
    """What a request asks of scored prefill: alternatives to keep per prompt token, and whether
    the generated output is shown (``max_tokens: 0`` hides the one token the prefill samples)."""

    texts: TokenTexts
    num_top: int
    shows_output: bool = True
    scores: bool = True  # False: an echo of max_tokens 0 without scores (the output is only hidden)


class Alternative(NamedTuple):
    """One of a token's most probable alternatives: id, text, log-probability and raw bytes."""

    token_id: int
    text: str
    logprob: float
    raw: bytes


@dataclass(frozen=True, slots=True)
class LogprobEntry:
    """One token's id, text and log-probability, with its alternatives, most probable first. The
    first prompt token has no log-probability (None) and no alternatives. `raw` is the token's own
    bytes (None: its text's UTF-8). `shown` is the text the output's incremental detokenization
    gave this token in context (None: not known, as for prompt tokens until an echo gives each its
    part of the echoed prompt), which differs from `text` where a decoder treats a token alone
    differently (SentencePiece's ``▁`` reads as a leading space except at the start); `settled`: no
    character was left open after it (its `shown` then holds the text of every token since the last
    settled one). On a core that cleans up tokenization spaces, `shown` is the text before the cleanup
    and `removed` the number of characters before it that the cleanup removes (final once the output
    hands the entry on, `OutputProcessor`; as known when it was made before that)."""

    token_id: int
    text: str
    logprob: float | None
    top: tuple[Alternative, ...] | None
    raw: bytes | None = None
    shown: str | None = None
    settled: bool = True
    removed: int = 0

    @property
    def token_bytes(self) -> bytes:
        return self.text.encode("utf-8") if self.raw is None else self.raw


class TokenTexts:
    """Each token id's text decoded alone and its raw bytes (both cached); shared by the requests
    of one model. `token_bytes` gives a token's bytes as the vocabulary spells them, or None for an
    id it cannot spell (the text's UTF-8 is used then); it must be safe to call from any thread."""

    def __init__(self, tokenizer, token_bytes: Callable[[int], bytes | None] = lambda token_id: None):
        self._tokenizer = tokenizer
        self._token_bytes = token_bytes
        self.text = lru_cache(maxsize=65536)(self._decode)
        self.raw = lru_cache(maxsize=65536)(self._raw)

    def _decode(self, token_id: int) -> str:
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def _raw(self, token_id: int) -> bytes:
        raw = self._token_bytes(token_id)
        if raw is None:
            return self.text(token_id).encode("utf-8")
        if not raw and self.text(token_id) == REPLACEMENT_CHAR:
            # llguidance marks its special tokens with a leading 0xFF byte (never in UTF-8), so it
            # spells the vocabulary's token of the lone byte 0xFF (byte-level "ÿ", byte-fallback
            # <0xFF>) as an unnamed special token: empty. That token alone reads U+FFFD.
            return b"\xff"
        return raw

    def entry(self, token_id: int, values: TokenLogprobs | None, num_top: int | None = None,
              shown: str | None = None, settled: bool = True, removed: int = 0) -> LogprobEntry:
        """`values` of `token_id` with at most `num_top` alternatives (None: all); a token without
        values (the first prompt token) gets None for both. `shown`/`settled`/`removed`: see `LogprobEntry`."""
        if values is None:
            return LogprobEntry(token_id, self.text(token_id), None, None, self.raw(token_id), shown, settled, removed)
        top = values.top if num_top is None else values.top[:num_top]
        return LogprobEntry(token_id, self.text(token_id), values.logprob,
                            tuple(Alternative(alt, self.text(alt), value, self.raw(alt)) for alt, value in top),
                            self.raw(token_id), shown, settled, removed)


def _number(value: float | None) -> float | None:
    """JSON has no -inf: a token the mask removed reports the most negative finite float."""
    if value is None:
        return None
    return value if math.isfinite(value) else -3.4028234663852886e38


def _chat_item(text: str, logprob: float, raw: bytes) -> dict:
    return {"token": text, "logprob": _number(logprob), "bytes": list(raw)}


def chat_logprobs(entries: Sequence[LogprobEntry]) -> dict:
    """A chat choice's (or chunk's) ``logprobs`` object."""
    content = []
    for entry in entries:
        item = _chat_item(entry.text, entry.logprob, entry.token_bytes)
        item["top_logprobs"] = [_chat_item(alt.text, alt.logprob, alt.raw) for alt in entry.top or ()]
        content.append(item)
    return {"content": content, "refusal": None}


class TextOffsets:
    """Where each scored token starts in a text completion's ``text``: the number of characters the
    tokens before it decode to, a character still open after them counted once (as the lossy UTF-8
    decoding of the text spells an incomplete one), so a character split over tokens belongs to the
    token with its first byte and a stray byte reads one U+FFFD, as in the text.

    A settled output token (`LogprobEntry.settled`) ends where the text its detokenization showed
    ends: the characters at the last settled token plus its `shown` text (which holds any character
    completed there), so a token whose text alone differs from its text in context (SentencePiece's
    ``▁`` word marker, a leading space in the text except at its start) counts as the text shows it.
    Otherwise (a character left open, or a token without `shown`) a token's text (decoded alone)
    counts as it is while no character is open and it holds no U+FFFD, and its raw bytes are decoded
    after the open character's where one is.

    On a core that cleans up tokenization spaces (" ." reads "."), the characters above are those of
    the text before the cleanup, and a token's offset leaves out those the cleanup removes before it
    (`LogprobEntry.removed`; the cleanup holds a space back until the text after it decides, so the
    token after " '" starts one character later than the text that token's step showed, and the
    output hands an entry on once the text after it has decided), and a later token never starts
    before an earlier one. One per response (a stream's chunks share it); mutable, used by one thread."""

    def __init__(self, start: int = 0):
        self._num_chars = start  # characters of complete text so far
        self._open = b""  # the bytes of a character not yet complete (at most 3)
        self._settled = start  # characters of text after the last token that left no character open
        self._last = start  # the last offset given

    @property
    def position(self) -> int:
        return self._num_chars + bool(self._open)

    def place(self, entries: Sequence[LogprobEntry]) -> list[int]:
        """The offsets of `entries` (the next tokens, in order); advances past them."""
        offsets = []
        for entry in entries:
            self._last = max(self._last, self.position - entry.removed)
            offsets.append(self._last)
            if entry.shown is not None and entry.settled:
                self._num_chars = self._settled = self._settled + len(entry.shown)
                self._open = b""
                continue
            if not self._open and "\ufffd" not in entry.text:
                self._num_chars += len(entry.text)
            else:
                num_chars, self._open = lossy_utf8(self._open + entry.token_bytes)
                self._num_chars += num_chars
            if entry.shown is None and not self._open:
                self._settled = self._num_chars
        return offsets

    def skip(self, text: str) -> None:
        """Advances past `text` shown without entries (an echoed prompt)."""
        self._num_chars = self._settled = self.position + len(text)
        self._open = b""


def echoed_token_texts(tokenizer: Decoder, token_ids: Sequence[int], text: str) -> tuple[str, ...]:
    """The part of `text` (a text completion's echoed prompt) each of `token_ids` (the prompt's
    tokens) contributes, in order; joined, they are `text`. A token's part is what the incremental
    detokenization of the prompt gives it in context, so a SentencePiece ``▁`` word keeps the space
    it shows there, and a character split over tokens belongs to the token with its first byte (as
    `TextOffsets` counts output tokens). Special tokens contribute their text when `text` holds it
    (ids decoded with special tokens, as an id prompt is echoed) and nothing otherwise (a BOS the
    tokenizer added to a text prompt). Where `text` is not the ids' decoding either way (a
    normalizing tokenizer, an unknown token), the decoding sharing more of its start and end with
    `text` is used: positions in their common prefix and suffix keep their place in `text`, and the
    text between goes to the token that ends in the suffix."""
    ids = list(token_ids)
    decodings = {skip: tokenizer.decode(ids, skip_special_tokens=skip) for skip in (False, True)}
    skip_special_tokens = next((skip for skip in (False, True) if decodings[skip] == text), None)
    if skip_special_tokens is None:
        skip_special_tokens = max((True, False), key=lambda skip: sum(_common_ends(decodings[skip], text)))
    decoded = decodings[skip_special_tokens]
    ends = _token_ends(tokenizer, ids, skip_special_tokens, decoded)
    if decoded != text:
        ends = _aligned(ends, decoded, text)
    starts = [0] + ends[:-1]
    return tuple(text[start:end] for start, end in zip(starts, ends))


def _token_ends(tokenizer: Decoder, token_ids: list[int], skip_special_tokens: bool, decoded: str) -> list[int]:
    """Where each token's text ends in `decoded` (the ids' decoding): the text completed so far, then
    as much of the open text as `decoded` shows there, and one character more for a character still
    open (its U+FFFD, one or one per byte as the decoder spells it, counted once, for the token
    holding its first byte); a stray byte already reading U+FFFD in `decoded` counts as its own
    character. The last token ends at the end of `decoded`, and ends never go back."""
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens, holds_byte_runs=False)
    ends, num_chars, last = [], 0, 0
    # The open text's settled pieces never change while its ids stay pending: each is compared once.
    num_pieces, settled_len, settled_agreed = 0, 0, None  # settled_agreed: where they first differ
    for token_id in token_ids:
        delta = detokenizer.feed(token_id)
        if delta:
            num_chars += len(delta)
            num_pieces, settled_len, settled_agreed = 0, 0, None
        for piece in detokenizer.settled_pieces(num_pieces):
            if settled_agreed is None:
                agreed = _agreed(piece, decoded[num_chars + settled_len:num_chars + settled_len + len(piece)])
                settled_agreed = settled_len + agreed if agreed < len(piece) else None
            settled_len += len(piece)
        num_pieces = detokenizer.num_settled_pieces
        live = detokenizer.unsettled_open_text
        if settled_agreed is None:
            start = num_chars + settled_len
            agreed = settled_len + _agreed(live, decoded[start:start + len(live)])
        else:
            agreed = settled_agreed
        last = min(max(last, num_chars + agreed + (agreed < settled_len + len(live))), len(decoded))
        ends.append(last)
    if ends:
        ends[-1] = len(decoded)
    return ends


def _agreed(text: str, shown: str) -> int:
    """The length of the longest common prefix of `text` and `shown`."""
    return next((i for i, (a, b) in enumerate(zip(text, shown)) if a != b), min(len(text), len(shown)))


def _common_ends(decoded: str, text: str) -> tuple[int, int]:
    """The lengths of the longest common prefix of `decoded` and `text` and of the longest common
    suffix of what follows it."""
    shorter = min(len(decoded), len(text))
    prefix = next((i for i in range(shorter) if decoded[i] != text[i]), shorter)
    suffix = next((i for i in range(shorter - prefix) if decoded[-1 - i] != text[-1 - i]), shorter - prefix)
    return prefix, suffix


def _aligned(positions: list[int], decoded: str, text: str) -> list[int]:
    """`positions` in `decoded` as positions in `text`: counted from the end within their common
    suffix, kept within their common prefix, the end of the prefix between (never decreasing; the
    end of `decoded` is the end of `text`)."""
    prefix, suffix = _common_ends(decoded, text)
    aligned = []
    for position in positions:
        if position >= len(decoded) - suffix:
            aligned.append(position - len(decoded) + len(text))
        else:
            aligned.append(min(position, prefix))
    return aligned


def text_logprobs(entries: Sequence[LogprobEntry], offsets: TextOffsets | None = None) -> dict:
    """A text completion choice's (or chunk's) ``logprobs`` object; `offsets` places the entries
    (and advances), a fresh `TextOffsets` when None."""
    text_offset = (offsets or TextOffsets()).place(entries)
    top = []
    for entry in entries:
        if entry.top is None:
            top.append(None)
            continue
        alternatives: dict[str, float] = {}
        for alt in entry.top:
            alternatives.setdefault(alt.text, _number(alt.logprob))  # two ids may decode alike: the likelier wins
        top.append(alternatives)
    return {"tokens": [e.text for e in entries], "token_logprobs": [_number(e.logprob) for e in entries],
            "top_logprobs": top, "text_offset": text_offset}


def prompt_logprobs_body(entries: Sequence[LogprobEntry | None]) -> list:
    """vLLM's ``prompt_logprobs``: per prompt token None (the first, or one without a score) or
    ``{id: {"logprob", "rank", "decoded_token"}}`` holding the token and its alternatives; ``rank``
    is 1-based among the alternatives (null for a token outside them)."""
    body: list = []
    for entry in entries:
        if entry is None or entry.logprob is None:
            body.append(None)
            continue
        ranked = {alt.token_id: rank for rank, alt in enumerate(entry.top or (), 1)}
        item = {str(entry.token_id): {"logprob": _number(entry.logprob), "rank": ranked.get(entry.token_id),
                                      "decoded_token": entry.text}}
        for alt in entry.top or ():
            item.setdefault(str(alt.token_id), {"logprob": _number(alt.logprob), "rank": ranked[alt.token_id],
                                                "decoded_token": alt.text})
        body.append(item)
    return body
