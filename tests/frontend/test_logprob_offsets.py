"""Text completions' ``logprobs.text_offset`` index the returned ``text`` exactly, also where the
tokenizer splits a character over tokens (each such token reads U+FFFD alone): token i's offset is
the length of the text its first i tokens decode to, in the JSON body and in a stream however its
chunks group the tokens (the offsets drifted by one per extra token of a split character)."""

from __future__ import annotations

import pytest

from helios.frontend.decoding.logprobs import LogprobEntry, TextOffsets, text_logprobs
from helios.server.schemas import CompletionRequest

from .test_step_run import GROUPINGS, accumulated, generate, qwen, streamed  # noqa: F401

# Characters the Qwen byte-level BPE spells over several tokens, between plain words.
TEXT = "a 𓀀 b 𝔘𝔫𝔦 c ꙮ😀 d"


@pytest.fixture(scope="module")
def split(qwen, qwen_tokenizer):
    eos = qwen_tokenizer.token_to_id("<|im_end|>")
    ids = qwen_tokenizer.encode(TEXT, add_special_tokens=False).ids
    body = CompletionRequest.model_validate({"model": qwen.served_id, "prompt": "Once", "logprobs": 1})
    prepared = qwen.prepare_completion(body, request_id="o", created=1)
    steps, final = generate(prepared, ids + [eos])
    pieces = [qwen_tokenizer.decode([i]) for i in ids]
    assert sum("\ufffd" in piece for piece in pieces) >= 4  # the text does split characters
    expected = [len(qwen_tokenizer.decode(ids[:i])) for i in range(len(ids))]
    return prepared, steps, final, expected


def test_json_offsets_index_the_text_across_split_characters(split):
    prepared, _, final, expected = split
    choice = prepared.response_body(final)["choices"][0]
    assert choice["text"] == TEXT
    assert choice["logprobs"]["text_offset"] == expected
    assert expected[-1] < len(TEXT) and TEXT[expected[-1]:] == " d"


@pytest.mark.parametrize("grouping", list(GROUPINGS))
def test_streamed_offsets_index_the_text_however_chunks_group_tokens(split, grouping):
    prepared, steps, final, expected = split
    for sizes in ([1] * len(steps), GROUPINGS[grouping](len(steps))):
        state = accumulated(streamed(prepared, steps, final, sizes), is_chat=False)
        assert state["text"] == TEXT and state["logprobs"]["text_offset"] == expected


def entry(text: str, raw: bytes) -> LogprobEntry:
    return LogprobEntry(len(raw), text, -1.0, (), raw)


def test_a_split_character_counts_once_for_the_token_with_its_first_byte():
    euro = "€".encode()
    tokens = [entry("a\ufffd", b"a" + euro[:2]), entry("\ufffdb", euro[2:] + b"b"), entry("c", b"c")]
    assert text_logprobs(tokens)["text_offset"] == [0, 2, 3]  # "a€bc": the euro sign is the first token's
    offsets = TextOffsets(5)
    assert offsets.place(tokens[:1]) == [5] and offsets.position == 7  # an open character counts once
    assert offsets.place(tokens[1:]) == [7, 8] and offsets.position == 9
    assert text_logprobs([entry("\ufffd", "\ufffd".encode()), entry("x", b"x")])["text_offset"] == [0, 1]


def test_stray_and_cut_bytes_read_one_replacement_character_each():
    """Bytes that form no character (a continuation byte first, a lead byte the next token does not
    continue) decode to U+FFFD in the text: each counts as one character there."""
    tokens = [entry("\ufffd", b"\x82"), entry("\ufffd", b"\xe2"), entry("x", b"x"), entry("y", b"y")]
    assert b"\x82\xe2xy".decode(errors="replace") == "\ufffd\ufffdxy"
    assert text_logprobs(tokens)["text_offset"] == [0, 1, 2, 3]
    offsets = TextOffsets()
    offsets.place(tokens[1:2])
    offsets.skip("echo")
    assert offsets.place(tokens[2:]) == [5, 6]
