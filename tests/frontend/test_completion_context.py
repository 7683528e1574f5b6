"""A text completion continues its prompt: on SentencePiece-style tokenizers, whose decoders drop
the leading space of a sequence's first ``▁`` word, the output's first word keeps the space it has
after the prompt (the output's detokenizer starts after the prompt's last tokens), so ``echo``'s
text is the decoding of prompt and output together; the output lost that space before (``fox.``
then ``the``). A prompt with no text but a BOS, or one ending inside a character, gives the
detokenizer no context (the output starts the text, or its bytes decode alone)."""

from __future__ import annotations

import pytest

from helios.frontend.decoding.detokenize import IncrementalDetokenizer
from support.echo_offsets import parts_of

from .test_echo_offsets import OUTPUT, PROMPT, run, spm  # noqa: F401


@pytest.mark.parametrize("echo", [False, True])
def test_the_output_s_first_word_keeps_its_leading_space(spm, echo):  # noqa: F811
    model, tokenizer = spm
    output_ids = tokenizer.encode(OUTPUT, add_special_tokens=False).ids
    assert tokenizer.id_to_token(output_ids[0]) == "▁the" and tokenizer.decode(output_ids) == OUTPUT.lstrip()
    prepared, _, final = run(model, tokenizer, PROMPT, output_ids, echo=echo, logprobs=None if echo else 1)
    choice = prepared.response_body(final)["choices"][0]
    assert choice["text"] == (PROMPT if echo else "") + OUTPUT
    prompt_ids = list(prepared.prompt_token_ids)
    assert choice["text"] == (tokenizer.decode(prompt_ids + output_ids) if echo else OUTPUT)
    if not echo:
        assert parts_of(choice["text"], choice["logprobs"]["text_offset"])[0] == " the"


def test_a_prompt_of_a_lone_bos_gives_no_context(spm):  # noqa: F811
    model, tokenizer = spm
    output_ids = tokenizer.encode(OUTPUT, add_special_tokens=False).ids
    prepared, _, final = run(model, tokenizer, "", output_ids)
    assert prepared.prompt_token_ids == (tokenizer.token_to_id("<s>"),)
    assert prepared.response_body(final)["choices"][0]["text"] == OUTPUT.lstrip()


def test_context_ending_inside_a_character_is_not_used(spm):  # noqa: F811
    _, tokenizer = spm
    euro = [tokenizer.token_to_id(f"<0x{byte:02X}>") for byte in "€".encode()]
    word = tokenizer.encode("Hello", add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False, context_ids=word + euro[:1])
    assert detokenizer.feed_many(euro[1:] + word) + detokenizer.finish() == tokenizer.decode(euro[1:] + word)
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False, context_ids=word + euro)
    assert detokenizer.feed_many(word) + detokenizer.finish() == " Hello"


def test_helios_generate_prints_a_plain_prompt_s_output_as_it_continues_the_prompt(spm):  # noqa: F811
    from helios.cli.generate_cmd import _output_text

    _, tokenizer = spm
    prompt_ids = tokenizer.encode(PROMPT).ids
    output_ids = tokenizer.encode(OUTPUT, add_special_tokens=False).ids + [tokenizer.token_to_id("</s>")]
    assert _output_text(tokenizer, output_ids, prompt_ids) == OUTPUT  # it printed the first word without its space
    assert _output_text(tokenizer, output_ids, ()) == tokenizer.decode(output_ids, skip_special_tokens=True)
