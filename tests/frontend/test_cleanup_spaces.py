"""Tokenization-space cleanup (`tokenizer_config.json`'s ``clean_up_tokenization_spaces``) against
transformers: `SpaceCleanup` streams transformers' own ``clean_up_tokenization`` however its input is
split, and an `IncrementalDetokenizer` that cleans streams deltas whose concatenation is what
``AutoTokenizer.from_pretrained(...).decode(ids)`` returns for a tokenizer that transformers cleans
(a WordLevel one here, of ``▁`` words: " '" is held until the next token shows whether " ' " follows).
Text completions' ``text_offset`` index the cleaned text (also where a lone space token is removed
once a later token decides, in the JSON body and in a stream), a stop cut in held text keeps the
entries of the tokens it shows, and a stop ending in a stray byte's U+FFFD sees a held space before it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from helios.frontend.decoding.detokenize import IncrementalDetokenizer, SpaceCleanup

SENTENCE = "Hello , world . I do n't know ! It 's fine ? We 've got it , they 're here . I 'm ok ' s"
PIECES = [" ", " ", " ", ".", "?", "!", ",", "'", "n", "t", "s", "m", "v", "e", "r", "x", "n't", " '"]


def reference_cleanup(text: str) -> str:
    return PreTrainedTokenizerBase.clean_up_tokenization(None, text)  # uses no state of the tokenizer


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.lists(st.sampled_from(PIECES), max_size=4).map("".join), max_size=20))
def test_streamed_cleanup_is_the_whole_text_cleanup(pieces):
    cleanup = SpaceCleanup()
    streamed = "".join(cleanup.push(piece) for piece in pieces) + cleanup.flush()
    assert streamed == reference_cleanup("".join(pieces))


def test_a_replacement_is_not_scanned_again_as_str_replace_does_not():
    # "  ." -> " ." (one replacement, no rescan); " ' " then makes " 's", which a later link replaces.
    for text in ["a  .", "x  ' s", "a ' ' b", "do  n't"]:
        for cut in range(len(text) + 1):
            cleanup = SpaceCleanup()
            assert cleanup.push(text[:cut]) + cleanup.push(text[cut:]) + cleanup.flush() == reference_cleanup(text)


@pytest.fixture(scope="module")
def word_level(tmp_path_factory) -> tuple[Tokenizer, object]:
    """A WordLevel tokenizer with SentencePiece-style ``▁`` words (not BPE, so transformers cleans) and
    transformers' view of it."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator([SENTENCE], trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    directory = tmp_path_factory.mktemp("word_level")
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"clean_up_tokenization_spaces": True, "eos_token": "</s>", "unk_token": "<unk>"}))
    return tokenizer, AutoTokenizer.from_pretrained(directory)


def test_cleaned_deltas_rebuild_transformers_decode(word_level):
    tokenizer, reference = word_level
    ids = tokenizer.encode(SENTENCE).ids
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False, clean_up_spaces=True)
    deltas = [detokenizer.feed(token_id) for token_id in ids] + [detokenizer.finish()]
    assert "".join(deltas) == reference.decode(ids) == reference_cleanup(SENTENCE)
    assert deltas[:4] == ["Hello", ",", " world", "."]
    assert deltas[-3:] == ["", "'s", ""]  # " '" may begin " ' ": held until " s" shows it does


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_ids_match_transformers_decode(word_level, data):
    tokenizer, reference = word_level
    ids = data.draw(st.lists(st.integers(0, tokenizer.get_vocab_size() - 1), max_size=30))
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False, clean_up_spaces=True)
    streamed = "".join(detokenizer.feed(token_id) for token_id in ids) + detokenizer.finish()
    assert streamed == reference.decode(ids)


def test_without_the_setting_text_is_not_cleaned(word_level):
    tokenizer, _ = word_level
    ids = tokenizer.encode(SENTENCE).ids
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert "".join(detokenizer.feed(token_id) for token_id in ids) + detokenizer.finish() == SENTENCE


def test_finish_releases_the_held_space(word_level):
    tokenizer, _ = word_level
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=False, clean_up_spaces=True)
    hello, quote = tokenizer.encode("Hello '").ids
    assert detokenizer.feed(hello) == "Hello"
    assert detokenizer.feed(quote) == ""
    assert detokenizer.fixed_open_text() == ""  # no id is pending: the held text is not open text
    assert detokenizer.finish() == " '"


def _served(tokenizer: Tokenizer, frontend_extra: dict):
    from helios.frontend.session import FrontendModel

    from .served import served_contract

    frontend = {"tool_parser": "TOOL_PARSER_NONE", "reasoning_parser": "REASONING_PARSER_NONE",
                "assistant_boundary": {"message_start": "", "message_end": "</s>", "assistant_header": "A:"},
                **frontend_extra}
    eos = tokenizer.token_to_id("</s>")
    contract = served_contract(tokenizer.get_vocab_size(), frontend, [eos],
                               [{"name": "eos_token", "text": "</s>", "token_id": eos}])
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return FrontendModel.from_contract(contract, tokenizer, template)


@pytest.mark.parametrize("declared", [True, False])
def test_a_core_declaring_the_cleanup_serves_cleaned_text(word_level, declared):
    """A core with `clean_up_tokenization_spaces` serves transformers' decode; one without the field
    (older cores) serves the raw decode, as before."""
    from helios.server.schemas import ChatCompletionRequest

    from .served import run_output

    tokenizer, reference = word_level
    model = _served(tokenizer, {"clean_up_tokenization_spaces": True} if declared else {})
    messages = [{"role": "user", "content": "I"}]
    body = ChatCompletionRequest.model_validate({"model": model.served_id, "messages": messages})
    prepared = model.prepare_chat(body, request_id="r1")
    ids = tokenizer.encode(SENTENCE).ids
    _, final = run_output(prepared, ids)
    text = prepared.response_body(final)["choices"][0]["message"]["content"]
    assert text == (reference.decode(ids) if declared else SENTENCE)


def test_helios_generate_prints_the_cleaned_text(word_level):
    """`helios generate`'s text of an output: cleaned as transformers' decode (skipping special tokens)
    where the core says so, as it was not before the flag reached it."""
    from helios.cli.generate_cmd import _output_text

    tokenizer, reference = word_level
    ids = tokenizer.encode(SENTENCE).ids
    assert _output_text(tokenizer, ids, (), clean_up_spaces=True) == reference.decode(ids, skip_special_tokens=True)
    assert _output_text(tokenizer, ids, ()) == tokenizer.decode(ids) != reference.decode(ids)


# --- log-probability offsets on a core that cleans -------------------------------------------------


def _kept_origins(text: str) -> list[int]:
    """The position in `text` of each character of its cleanup (each replacement keeps characters of
    its pattern, from the second on)."""
    from helios.frontend.decoding.detokenize import CLEANUP_REPLACEMENTS

    chars = list(enumerate(text))
    for old, new in CLEANUP_REPLACEMENTS:
        spelled, out, at = "".join(char for _, char in chars), [], 0
        while (found := spelled.find(old, at)) >= 0:
            out += chars[at:found] + chars[found + 1:found + 1 + len(new)]
            at = found + len(old)
        chars = out + chars[at:]
    assert "".join(char for _, char in chars) == reference_cleanup(text)
    return [origin for origin, _ in chars]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.lists(st.sampled_from(PIECES), max_size=4).map("".join), min_size=1, max_size=12))
def test_removed_counts_the_cleaned_characters_before_the_push(pieces):
    """`num_removed` after a push: the characters pushed before it that the cleanup of the text so far
    (ended there) removes."""
    cleanup, pushed = SpaceCleanup(), ""
    for piece in pieces:
        cleanup.push(piece)
        kept = _kept_origins(pushed + piece)
        assert cleanup.num_removed == len(pushed) - sum(origin < len(pushed) for origin in kept)
        pushed += piece


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.lists(st.sampled_from(PIECES), max_size=4).map("".join), min_size=1, max_size=12))
def test_removed_before_is_the_whole_texts_count_once_decided(pieces):
    """`removed_before(position)` after each push: the characters before `position` that the cleanup
    of the whole text removes, or None while it holds one of them; after `flush`, known everywhere."""
    whole = "".join(pieces)
    kept = _kept_origins(whole)
    cleanup, num_pushed = SpaceCleanup(), 0
    for piece in pieces:
        cleanup.push(piece)
        num_pushed += len(piece)
        for position in range(num_pushed + 1):
            removed = cleanup.removed_before(position)
            assert removed in (None, position - sum(origin < position for origin in kept))
        assert cleanup.removed_before(0) == 0
    cleanup.flush()
    assert [cleanup.removed_before(p) for p in range(len(whole) + 1)] == [
        p - sum(origin < p for origin in kept) for p in range(len(whole) + 1)]


def _text_completion_offsets(tokenizer: Tokenizer, ids: list[int]) -> tuple[str, list[int]]:
    """The text and ``text_offset`` a text completion returns for output `ids` on a cleaning core."""
    from helios.frontend.decoding.logprobs import TokenTexts, text_logprobs
    from helios.frontend.decoding.observation import ObservationOptions
    from helios.frontend.parsers.pipeline import OutputPipeline, PlainText
    from helios.frontend.responses.output import OutputProcessor
    from helios.runtime.records.events import FinishReason, TokenLogprobs

    eos = tokenizer.token_to_id("</s>")
    output = OutputProcessor(IncrementalDetokenizer(tokenizer, skip_special_tokens=False, clean_up_spaces=True),
                             OutputPipeline(PlainText()), None, [eos], ObservationOptions(), [eos], None,
                             TokenTexts(tokenizer))
    events = [event for token_id in ids for event in output.feed(token_id, None, TokenLogprobs(-1.0, ())).events]
    final = output.finish(FinishReason.LENGTH)
    text = "".join(event.text for event in events + list(final.events))
    return text, text_logprobs(final.logprobs)["text_offset"]


def test_text_offsets_index_the_cleaned_text(word_level):
    """``text_offset`` index the returned (cleaned) text: the cleanup holds " '" back until the next
    token shows whether " ' " follows, and the offsets counted the text each step showed, so the
    token after it started at the held space (5, in "Hello '<unk>"), and every token after a removed
    space one character late."""
    tokenizer, reference = word_level
    ids = tokenizer.encode("Hello ' x").ids
    text, offsets = _text_completion_offsets(tokenizer, ids)
    assert text == reference.decode(ids) == "Hello '<unk>"
    assert offsets == [0, 5, 7]
    ids = tokenizer.encode("We 've got it , they 're here . I 'm ok ' s").ids
    text, offsets = _text_completion_offsets(tokenizer, ids)
    assert text == "We've got it, they're here. I'm ok's"
    assert [text[offset:offset + 3] for offset in offsets] == [
        "We'", "'ve", " go", " it", ", t", " th", "'re", " he", ". I", " I'", "'m ", " ok", "'s", "s"]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_text_offsets_start_each_token_in_the_cleaned_text(word_level, data):
    """Each token's offset is where its text starts in the cleaned text: the characters of the text
    before it that the cleanup keeps."""
    tokenizer, reference = word_level
    eos = tokenizer.token_to_id("</s>")
    ids = data.draw(st.lists(st.integers(0, tokenizer.get_vocab_size() - 1).filter(lambda i: i != eos),
                             min_size=1, max_size=30))
    text, offsets = _text_completion_offsets(tokenizer, ids)
    raw = tokenizer.decode(ids, skip_special_tokens=False)
    assert text == reference.decode(ids, skip_special_tokens=False) == reference_cleanup(raw)
    kept = _kept_origins(raw)
    assert offsets == [sum(origin < len(tokenizer.decode(ids[:count], skip_special_tokens=False)) for origin in kept)
                       for count in range(len(ids))]


def _stopped(tokenizer: Tokenizer, ids: list[int], stops: tuple[str, ...]):
    """The text a request with string stops `stops` returns for output `ids` on a cleaning core, and
    the ids of its log-probability entries."""
    from helios.frontend.decoding.logprobs import TokenTexts
    from helios.frontend.decoding.observation import ObservationOptions
    from helios.frontend.decoding.stops import StopOptions
    from helios.frontend.parsers.pipeline import OutputPipeline, PlainText
    from helios.frontend.responses.output import OutputProcessor
    from helios.runtime.records.events import FinishReason, TokenLogprobs

    eos = tokenizer.token_to_id("</s>")
    output = OutputProcessor(IncrementalDetokenizer(tokenizer, skip_special_tokens=False, clean_up_spaces=True),
                             OutputPipeline(PlainText()), StopOptions(strings=stops).new_matcher(), [eos],
                             ObservationOptions(), [eos], None, TokenTexts(tokenizer))
    events = [event for token_id in ids for event in output.feed(token_id, None, TokenLogprobs(-1.0, ())).events]
    final = output.finish(FinishReason.LENGTH)
    return "".join(event.text for event in events + list(final.events)), [e.token_id for e in final.logprobs]


def test_a_stop_in_held_text_keeps_the_entries_of_the_tokens_it_shows(word_level):
    """A stop cut in text the cleanup held back lists the tokens whose text starts before the cut: the
    delta " '<unk>" carries " '" of the token before it, whose entry was dropped (the entries were
    placed as if the delta were the last token's alone), and at the end the flushed " '" dropped its
    token's entry."""
    tokenizer, _ = word_level
    hello, quote = tokenizer.encode("Hello '").ids
    unknown = tokenizer.token_to_id("<unk>")
    assert _stopped(tokenizer, [hello, quote, unknown], ("'",)) == ("Hello ", [hello, quote])
    assert _stopped(tokenizer, [hello, quote], ("'",)) == ("Hello ", [hello, quote])
    assert _stopped(tokenizer, [hello, quote, unknown], ("<",)) == ("Hello '", [hello, quote])


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_stops_list_the_tokens_before_the_cut(word_level, data):
    """Cut at the first stop of the cleaned text, the entries are those of the tokens whose text
    starts before the cut."""
    tokenizer, _ = word_level
    eos = tokenizer.token_to_id("</s>")
    ids = data.draw(st.lists(st.integers(0, tokenizer.get_vocab_size() - 1).filter(lambda i: i != eos),
                             min_size=1, max_size=20))
    raw = tokenizer.decode(ids, skip_special_tokens=False)
    whole = reference_cleanup(raw)
    start = data.draw(st.integers(0, len(whole) - 1))
    stop = whole[start:start + data.draw(st.integers(1, 3))]
    text, listed = _stopped(tokenizer, ids, (stop,))
    cut = whole.find(stop)
    assert text == whole[:cut]
    kept = _kept_origins(raw)
    starts = [sum(origin < len(tokenizer.decode(ids[:count], skip_special_tokens=False)) for origin in kept)
              for count in range(len(ids))]
    assert listed == [token_id for token_id, at in zip(ids, starts) if at < cut]


def test_a_stop_ending_in_a_stray_byte_sees_the_held_space():
    """A stop ending in U+FFFD completes at a stray byte that follows a space the cleanup holds: the
    U+FFFD was looked at without the space before it, so " \\ufffd" matched a token late (once the
    next token settled the byte). Embedded tokenizer (byte-level; cleaned as a core whose
    tokenizer_config asks for it even on BPE)."""
    from pathlib import Path

    from helios.frontend.decoding.observation import ObservationOptions
    from helios.frontend.decoding.stops import StopOptions
    from helios.frontend.parsers.pipeline import OutputPipeline, PlainText
    from helios.frontend.responses.output import OutputProcessor

    tokenizer = Tokenizer.from_file(str(Path(__file__).resolve().parents[2]
                                        / "src/helios/embedded/default_model/tokenizer.json"))
    stray = 104  # the lone byte 0xA5
    assert tokenizer.decode([stray]) == "\ufffd"
    ids = tokenizer.encode("x ", add_special_tokens=False).ids + [stray, stray]
    output = OutputProcessor(IncrementalDetokenizer(tokenizer, skip_special_tokens=False, clean_up_spaces=True),
                             OutputPipeline(PlainText()), StopOptions(strings=(" \ufffd",)).new_matcher(), [],
                             ObservationOptions(), [], None)
    stopped = [output.feed(token_id).is_stopped for token_id in ids]
    assert stopped == [False, False, True, True]


@pytest.mark.parametrize("declared", [True, False])
def test_an_echoed_id_prompt_is_cleaned_as_the_output_is(word_level, declared):
    """A text completion's ``echo`` of an id prompt on a core that cleans up tokenization spaces is
    transformers' decode of the ids (it was the raw decode: "Hello , world ." beside a cleaned
    output); a text prompt is echoed as sent, and a core without the cleanup echoes the raw decode."""
    from helios.server.schemas import CompletionRequest

    from .served import run_output

    tokenizer, reference = word_level
    model = _served(tokenizer, {"clean_up_tokenization_spaces": True} if declared else {})
    ids = tokenizer.encode(SENTENCE).ids
    for prompt, echoed in ((ids, reference.decode(ids) if declared else SENTENCE), (SENTENCE, SENTENCE)):
        body = CompletionRequest.model_validate({"model": model.served_id, "prompt": prompt, "echo": True,
                                                 "max_tokens": 1})
        prepared = model.prepare_completion(body, request_id="r1")
        _, final = run_output(prepared, tokenizer.encode("I").ids)
        text = prepared.response_body(final)["choices"][0]["text"]
        assert text.startswith(echoed) and text[len(echoed):] in ("I", " I")


def test_an_echoed_id_prompt_keeps_each_tokens_part_of_the_cleaned_text(word_level):
    """``echo`` with ``logprobs`` of an id prompt on a cleaning core: each prompt token's part of the
    echoed (cleaned) text is its own text cleaned in turn (a removed space shows nowhere), and the
    parts join to the echo. Before, aligning the raw decode to the cleaned text gave every token
    between the first and the last difference no text (all their offsets 5)."""
    import dataclasses

    from helios.runtime.records.events import FinishReason, PromptScoresEvent, TokenLogprobs
    from helios.server.schemas import CompletionRequest

    from support.echo_offsets import parts_of

    tokenizer, reference = word_level
    model = _served(tokenizer, {"clean_up_tokenization_spaces": True})
    model._facts = dataclasses.replace(model._facts, token_logprobs=5, scores_prompts=True)
    ids = tokenizer.encode(SENTENCE).ids
    body = CompletionRequest.model_validate({"model": model.served_id, "prompt": ids, "echo": True, "logprobs": 1,
                                             "max_tokens": 1})
    prepared = model.prepare_completion(body, request_id="e", created=1)
    output = prepared.new_output()
    output.score_prompt(PromptScoresEvent("e", 1, tuple(TokenLogprobs(-1.0, ((t, -1.0),)) for t in ids[1:])))
    output.feed(ids[0], None, TokenLogprobs(-0.5, ((ids[0], -0.5),)))
    choice = prepared.response_body(output.finish(FinishReason.LENGTH))["choices"][0]
    echo = reference.decode(ids)
    parts = parts_of(choice["text"], choice["logprobs"]["text_offset"])[:len(ids)]
    assert choice["text"].startswith(echo) and "".join(parts) == echo
    assert parts[:8] == ["Hello", ",", " world", ".", " I", " do", "n't", " know"]


# --- a lone space token that the cleanup removes ----------------------------------------------------


def _embedded_tokenizer() -> Tokenizer:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return Tokenizer.from_file(str(root / "src/helios/embedded/default_model/tokenizer.json"))


def _streamed_offsets(tokenizer: Tokenizer, ids: list[int], stops: tuple[str, ...] = ()):
    """The text, the JSON body's ``text_offset`` and a stream's (each step's entries placed as its
    chunk places them, the rest at the end) of output `ids` on a cleaning core."""
    from helios.frontend.decoding.logprobs import TextOffsets, TokenTexts, text_logprobs
    from helios.frontend.decoding.observation import ObservationOptions
    from helios.frontend.decoding.stops import StopOptions
    from helios.frontend.parsers.pipeline import OutputPipeline, PlainText
    from helios.frontend.responses.output import OutputProcessor
    from helios.runtime.records.events import FinishReason, TokenLogprobs

    output = OutputProcessor(IncrementalDetokenizer(tokenizer, skip_special_tokens=False, clean_up_spaces=True),
                             OutputPipeline(PlainText()), StopOptions(strings=stops).new_matcher() if stops else None,
                             [], ObservationOptions(), [], None, TokenTexts(tokenizer))
    stream, streamed, events = TextOffsets(), [], []
    for token_id in ids:
        step = output.feed(token_id, None, TokenLogprobs(-1.0, ()))
        events += step.events
        streamed += text_logprobs(step.logprobs, stream)["text_offset"]
        if step.is_stopped:
            break
    final = output.finish(FinishReason.LENGTH)
    streamed += text_logprobs(final.logprobs[len(streamed):], stream)["text_offset"]
    text = "".join(event.text for event in events + list(final.events))
    return text, text_logprobs(final.logprobs)["text_offset"], streamed


def test_a_removed_lone_space_token_moves_the_offsets_after_it():
    """A lone space token (byte-level "Ġ") that a later token shows the cleanup removes (" 's" reads
    "'s", " n't" reads "n't"): the token after the space starts where the space was, in the JSON body
    and in a stream. Its offset was placed while the cleanup still held the space (as if kept), one
    past its text ([0, 1, 1] for "'s"); its entry now waits for the text that decides."""
    tokenizer = _embedded_tokenizer()

    def ids(*texts):
        return [tokenizer.token_to_id(text) for text in texts]

    assert _streamed_offsets(tokenizer, ids("Ġ", "'", "s")) == ("'s", [0, 0, 1], [0, 0, 1])
    assert _streamed_offsets(tokenizer, ids("x", "Ġn", "'", "t")) == ("xn't", [0, 1, 2, 3], [0, 1, 2, 3])
    assert _streamed_offsets(tokenizer, ids("x", "Ġ", "'", "Ġ", "s")) == ("x's", [0, 1, 1, 2, 2], [0, 1, 1, 2, 2])
    assert _streamed_offsets(tokenizer, ids("x", "Ġ", "'")) == ("x '", [0, 1, 2], [0, 1, 2])  # kept at the end


CLEANED_WORDS = [" ", "'", "s", " n't", " 're", "m", ".", "?", ",", "x", "é"]  # lone spaces, pieces of each pattern


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_byte_level_offsets_start_each_token_in_the_cleaned_text(data):
    """Random outputs of a byte-level tokenizer's tokens around the cleaned patterns (lone spaces, a
    stray byte), with and without a stop: each listed token's offset, in the JSON body and in a stream,
    is where its text starts in the cleaned text (the characters before it that the cleanup keeps)."""
    tokenizer = _embedded_tokenizer()
    pool = sorted({i for word in CLEANED_WORDS for i in tokenizer.encode(word, add_special_tokens=False).ids} | {104})
    ids = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=10))
    raw = tokenizer.decode(ids, skip_special_tokens=False)
    whole = reference_cleanup(raw)
    stops = ()
    if data.draw(st.booleans()):
        start = data.draw(st.integers(0, len(whole) - 1))
        stops = (whole[start:start + data.draw(st.integers(1, 3))],)
    text, offsets, streamed = _streamed_offsets(tokenizer, ids, stops)
    assert text == (whole[:whole.find(stops[0])] if stops else whole)
    kept = _kept_origins(raw)
    starts = [sum(origin < len(tokenizer.decode(ids[:count], skip_special_tokens=False)) for origin in kept)
              for count in range(len(ids))]
    assert offsets == streamed == starts[:len(offsets)]
