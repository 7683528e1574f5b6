"""``echo`` with ``logprobs`` through the official `openai` client over the in-process app (ASGI),
on the tiny core prepared with scored prefill: for a list of text prompts and a list of id prompts
(with characters the byte-level tokenizer splits over tokens, an id prompt with a special token) and
``n`` 2, every choice's
``text_offset`` start at 0, never decrease, cut the echoed prompt into each prompt token's part of
it and continue from the echoed text's length with the output's, streamed (per choice index) and
not, the stream's equal to the body's."""

from __future__ import annotations

import pytest

from support.echo_offsets import expected_parts, parts_of
from support.server_core import SERVED_ID, openai_client
from test_prompt_scores import _scored_core, _serve  # tests/server is on sys.path (no package)

TEXTS = ["hello world 😀, ünï 𝔘 the fox", "the lazy dog ✓ ꙮ<|im_end|> in paris"]
N = 2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = _serve(_scored_core(tmp_path_factory.getbasetemp()))
    yield served
    served.shutdown()


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served)


@pytest.fixture(scope="module", params=["texts", "ids"])
def prompts(request, served):
    tokenizer = served.frontend._tokenizer
    ids = [tokenizer.encode(text, add_special_tokens=False).ids for text in TEXTS]
    assert all(sum("\ufffd" in tokenizer.decode([i]) for i in prompt) >= 2 for prompt in ids)  # split characters
    return TEXTS if request.param == "texts" else ids


async def _collect(stream) -> list:
    return [chunk async for chunk in stream]


def _choices(runner, client, prompts, stream: bool) -> dict[int, tuple[str, list[str], list[int]]]:
    """index -> (text, tokens, text_offset) of every choice."""
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=prompts, n=N, max_tokens=4, echo=True,
                                                    logprobs=2, temperature=0, stream=stream))
    if not stream:
        return {c.index: (c.text, c.logprobs.tokens, c.logprobs.text_offset) for c in response.choices}
    choices: dict[int, tuple[str, list[str], list[int]]] = {}
    for chunk in runner.run(_collect(response)):
        for choice in chunk.choices:
            text, tokens, offsets = choices.setdefault(choice.index, ("", [], []))
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                offsets += choice.logprobs.text_offset
            choices[choice.index] = (text + choice.text, tokens, offsets)
    return choices


@pytest.mark.parametrize("stream", [False, True])
def test_echoed_offsets_index_every_choice_s_text(runner, client, served, prompts, stream):
    tokenizer = served.frontend._tokenizer
    choices = _choices(runner, client, prompts, stream)
    assert sorted(choices) == list(range(N * len(prompts)))
    for index, (text, tokens, offsets) in choices.items():
        prompt = prompts[index // N]
        ids = tokenizer.encode(prompt, add_special_tokens=True).ids if isinstance(prompt, str) else prompt
        echo = prompt if isinstance(prompt, str) else tokenizer.decode(ids, skip_special_tokens=False)
        assert text.startswith(echo) and len(tokens) == len(offsets) > len(ids)
        parts = parts_of(text, offsets)
        assert parts[:len(ids)] == expected_parts(tokenizer, ids, echo, skip_special_tokens=False)
        assert offsets[len(ids)] == len(echo) and "".join(parts[len(ids):]) == text[len(echo):]


def test_streamed_echo_offsets_equal_the_body_s(runner, client, prompts):
    assert _choices(runner, client, prompts, True) == _choices(runner, client, prompts, False)
