"""What a text completion's ``logprobs.text_offset`` should say of an echoed prompt: each prompt
token's part of the echoed text, computed from the tokenizer's decoding of the prompt's prefixes
(independently of the detokenizer the server uses), and the parts a choice's offsets cut its
``text`` into."""

from __future__ import annotations

from typing import Sequence


def expected_parts(tokenizer, ids: Sequence[int], text: str, skip_special_tokens: bool) -> list[str]:
    """Token i's part of `text` (the ids' decoding): from where its predecessors' decoding ends (an
    open character counted once) to where its own does."""
    ids = list(ids)
    assert tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) == text
    ends = []
    for i in range(1, len(ids) + 1):
        shown = tokenizer.decode(ids[:i], skip_special_tokens=skip_special_tokens)
        complete = shown.rstrip("\ufffd")
        ends.append(len(complete) + (complete != shown))
    ends[-1] = len(text)
    return [text[start:end] for start, end in zip([0] + ends[:-1], ends)]


def parts_of(text: str, offsets: Sequence[int]) -> list[str]:
    """`text` cut at `offsets`, which must start at 0 and never decrease."""
    offsets = list(offsets)
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] <= len(text)
    bounds = offsets + [len(text)]
    return [text[bounds[i]:bounds[i + 1]] for i in range(len(offsets))]
