"""``echo`` with ``logprobs`` on text completions: the echoed prompt tokens' ``text_offset`` index
the returned ``text`` as the output tokens' do. Token i's part of the echoed text is
``text[text_offset[i]:text_offset[i + 1]]``: what the prompt's incremental detokenization gives it
in context (a SentencePiece ``▁`` word keeps its leading space, a character split over tokens
belongs to the token with its first byte), a BOS the tokenizer added to a text prompt contributes
nothing (the echoed text is the prompt as given) and one in an id prompt its text (the ids are
echoed decoded with special tokens); the output's offsets continue from the echoed text's length,
in the JSON body and in a stream however its chunks group the tokens. Before, each prompt token
counted as its text decoded alone: offsets drifted by one per ``▁`` word and by the BOS's length.

Real tokenizers: the SentencePiece-style ones of `test_logprob_offsets_spm` (Llama-2's and the
Metaspace decoder, byte fallback) with a BOS post-processor, and the Qwen byte-level BPE."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from helios.frontend.decoding.logprobs import echoed_token_texts
from helios.frontend.session import FrontendModel
from helios.runtime.records.events import FinishReason, PromptScoresEvent, TokenLogprobs
from helios.server.schemas import CompletionRequest
from support.echo_offsets import expected_parts, parts_of

from .served import qwen_model, served_contract
from .test_logprob_offsets_spm import DECODERS, EOS, sentencepiece_like
from .test_step_run import GROUPINGS, accumulated, streamed

BOS = 1
PROMPT = "Hello world, €uro 𓀀 the  fox."
OUTPUT = " the quick fox"
NONE_FRONTEND = {"tool_parser": "TOOL_PARSER_NONE", "reasoning_parser": "REASONING_PARSER_NONE",
                 "assistant_boundary": {"message_start": "", "message_end": "</s>", "assistant_header": "A:"}}


@pytest.fixture(scope="module", params=list(DECODERS))
def spm(request):
    """A Llama-style frontend: SentencePiece-like tokenizer whose encoding starts with BOS, a core
    with token-logprobs programs and scored prefill."""
    tokenizer = sentencepiece_like(DECODERS[request.param])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    contract = served_contract(tokenizer.get_vocab_size(), NONE_FRONTEND, [EOS])
    model = FrontendModel.from_contract(contract, tokenizer, "{% for m in messages %}{{ m.content }}{% endfor %}")
    model._facts = dataclasses.replace(model._facts, token_logprobs=5, scores_prompts=True)
    return model, tokenizer


@pytest.fixture(scope="module")
def qwen(qwen_tokenizer):
    model = copy.copy(qwen_model(qwen_tokenizer))
    model._facts = dataclasses.replace(model._facts, token_logprobs=5, scores_prompts=True)
    return model, qwen_tokenizer


def run(model, tokenizer, prompt, output_ids: list[int], **fields):
    """A prepared echo request fed like the engine feeds it (prompt scores where it asks for them,
    then the output ids and EOS): (prepared, steps, final)."""
    body = CompletionRequest.model_validate({"model": model.served_id, "prompt": prompt, "echo": True, "logprobs": 2,
                                             "max_tokens": len(output_ids) + 1, **fields})
    prepared = model.prepare_completion(body, request_id="e", created=1)
    output = prepared.new_output()
    prompt_ids = prepared.prompt_token_ids
    if prepared.params.score_prompt:
        output.score_prompt(PromptScoresEvent("e", 1, tuple(TokenLogprobs(-1.0, ((t, -1.0), (BOS, -2.0)))
                                                              for t in prompt_ids[1:])))
    steps = [output.feed(t, None, TokenLogprobs(-0.5, ((t, -0.5),))) for t in output_ids + [EOS]]
    final = output.finish(FinishReason.EOS)
    return prepared, [s for s in steps if s.events or s.logprobs or s.prompt_logprobs], final


def check(tokenizer, prepared, text: str, logprobs: dict, echo: str, skip_special_tokens: bool) -> None:
    """The whole choice's offsets: the prompt's parts, then the output's from the echo's end."""
    prompt_ids = list(prepared.prompt_token_ids)
    offsets = logprobs["text_offset"]
    assert len(offsets) == len(logprobs["tokens"]) > len(prompt_ids)
    parts = parts_of(text, offsets)
    assert parts[:len(prompt_ids)] == expected_parts(tokenizer, prompt_ids, echo, skip_special_tokens)
    assert offsets[len(prompt_ids)] == len(echo) and text.startswith(echo)
    assert "".join(parts[len(prompt_ids):]) == text[len(echo):]


@pytest.mark.parametrize("by_ids", [False, True], ids=["text prompt", "id prompt"])
def test_echoed_offsets_follow_the_text_on_sentencepiece_with_bos(spm, by_ids):
    model, tokenizer = spm
    ids = tokenizer.encode(PROMPT).ids
    assert ids[0] == BOS
    prepared, _, final = run(model, tokenizer, ids if by_ids else PROMPT,
                             tokenizer.encode(OUTPUT, add_special_tokens=False).ids)
    echo = tokenizer.decode(ids, skip_special_tokens=False) if by_ids else PROMPT
    choice = prepared.response_body(final)["choices"][0]
    check(tokenizer, prepared, choice["text"], choice["logprobs"], echo, skip_special_tokens=not by_ids)
    parts = parts_of(choice["text"], choice["logprobs"]["text_offset"])
    assert parts[0] == ("<s>" if by_ids else "")  # the BOS: in the echoed text only when the ids are echoed
    world = ids.index(tokenizer.token_to_id("▁world,"))
    assert parts[world] == " world," and choice["logprobs"]["tokens"][world] == "world,"  # its text alone
    euro = ids.index(tokenizer.token_to_id("<0xE2>"))
    assert parts[euro:euro + 3] == ["€", "", ""]  # a split character: the token with its first byte


def test_a_stream_echoing_an_empty_text_still_lists_its_prompt_tokens(spm):
    """A text prompt of no text is its BOS alone: the stream's echo chunk (empty text) carries the
    BOS's entry, as the body lists it (the chunk was dropped with its entry)."""
    model, tokenizer = spm
    prepared, steps, final = run(model, tokenizer, "", tokenizer.encode(OUTPUT, add_special_tokens=False).ids,
                                 stream=True)
    body = prepared.response_body(final)["choices"][0]
    assert body["logprobs"]["tokens"][0] == "<s>" and body["logprobs"]["text_offset"][:2] == [0, 0]
    state = accumulated(streamed(prepared, steps, final, [1] * len(steps)), is_chat=False)
    assert state["text"] == body["text"] and state["logprobs"] == body["logprobs"]


def test_a_text_prompt_holding_a_special_token_s_text_echoes_it_and_not_the_bos(spm):
    """The ids decode to the text neither with special tokens (the BOS) nor without (``</s>``): the
    special tokens' texts are kept and the BOS's falls before the echoed text."""
    model, tokenizer = spm
    prompt = "Hello world,</s> the fox"
    prepared, _, final = run(model, tokenizer, prompt, tokenizer.encode(OUTPUT, add_special_tokens=False).ids)
    choice = prepared.response_body(final)["choices"][0]
    parts = parts_of(choice["text"], choice["logprobs"]["text_offset"])
    assert parts == ["", "Hello", " world,", "</s>", " the", " fox", " the", " quick", " fox"]
    assert choice["text"] == prompt + OUTPUT


@pytest.mark.parametrize("grouping", list(GROUPINGS))
@pytest.mark.parametrize("by_ids", [False, True], ids=["text prompt", "id prompt"])
def test_streamed_echo_offsets_equal_the_body_s(spm, by_ids, grouping):
    model, tokenizer = spm
    ids = tokenizer.encode(PROMPT).ids
    prepared, steps, final = run(model, tokenizer, ids if by_ids else PROMPT,
                                 tokenizer.encode(OUTPUT, add_special_tokens=False).ids, stream=True)
    body = prepared.response_body(final)["choices"][0]
    echo = tokenizer.decode(ids, skip_special_tokens=False) if by_ids else PROMPT
    check(tokenizer, prepared, body["text"], body["logprobs"], echo, skip_special_tokens=not by_ids)
    for sizes in ([1] * len(steps), GROUPINGS[grouping](len(steps))):
        state = accumulated(streamed(prepared, steps, final, sizes), is_chat=False)
        assert state["text"] == body["text"]
        assert state["logprobs"]["text_offset"] == body["logprobs"]["text_offset"]
        assert state["logprobs"]["tokens"] == body["logprobs"]["tokens"]


@pytest.mark.parametrize("stream", [False, True])
def test_echo_without_output_ends_its_offsets_in_the_echoed_text(spm, stream):
    model, tokenizer = spm
    prepared, steps, final = run(model, tokenizer, PROMPT, [], max_tokens=0, stream=stream)
    if stream:
        state = accumulated(streamed(prepared, steps, final, [len(steps)]), is_chat=False)
        text, logprobs = state["text"], state["logprobs"]
    else:
        choice = prepared.response_body(final)["choices"][0]
        text, logprobs = choice["text"], choice["logprobs"]
    assert text == PROMPT
    ids = list(prepared.prompt_token_ids)
    assert parts_of(text, logprobs["text_offset"]) == expected_parts(tokenizer, ids, PROMPT, True)


@pytest.mark.parametrize("by_ids", [False, True], ids=["text prompt", "id prompt"])
def test_echoed_offsets_follow_the_text_of_split_characters_in_byte_level_bpe(qwen, by_ids):
    model, tokenizer = qwen
    prompt = "a 𓀀 b 𝔘𝔫𝔦 <|endoftext|>ꙮ😀 d"
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    assert sum("\ufffd" in tokenizer.decode([i]) for i in ids) >= 4
    prepared, steps, final = run(model, tokenizer, ids if by_ids else prompt,
                                 tokenizer.encode(" e 😀 f", add_special_tokens=False).ids, stream=True)
    choice = prepared.response_body(final)["choices"][0]
    check(tokenizer, prepared, choice["text"], choice["logprobs"], prompt, skip_special_tokens=False)
    state = accumulated(streamed(prepared, steps, final, [1] * len(steps)), is_chat=False)
    assert state["logprobs"]["text_offset"] == choice["logprobs"]["text_offset"]


def test_a_text_the_ids_do_not_decode_to_keeps_the_parts_in_order():
    """A normalizing tokenizer (lowercase, NFKC) echoes the prompt as given, which its ids do not
    decode to: the parts still join to the echoed text, the common prefix and suffix in place, the
    text between them the part of the token that ends past it."""
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "fine": 2, "day": 3}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    text = "hello ﬁne Day"
    ids = tokenizer.encode(text).ids
    assert ids == [1, 2, 3] and tokenizer.decode(ids) == "hello fine day"
    assert echoed_token_texts(tokenizer, ids, text) == ("hello", " ", "ﬁne Day")
    assert echoed_token_texts(tokenizer, [1, 0, 3], "hello ☃ day") == ("hello", " ☃", " day")
    assert echoed_token_texts(tokenizer, [1, 3], "hello day") == ("hello", " day")
