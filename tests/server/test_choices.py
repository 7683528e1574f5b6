"""Several choices per response through the official `openai` client (in-process app): ``n`` and
batched prompts, streamed and not; choice j samples with seed + j."""

from __future__ import annotations


import httpx
import openai
import pytest

from helios.server.app import create_app
from support.server_core import NAMESPACE, SERVED_ID, openai_client, served_tiny_core


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 8, frontend_workers=2, owned_by=NAMESPACE) as served:
        yield served


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served)


def chat(client, **fields):
    return client.chat.completions.create(model=SERVED_ID, messages=[{"role": "user", "content": "hello"}],
                                          **{"max_tokens": 4, **fields})


async def collect(stream) -> list:
    return [chunk async for chunk in stream]


def streamed_texts(chunks, n: int, is_chat: bool) -> tuple[list[str], list]:
    texts, reasons = [""] * n, [None] * n
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += (choice.delta.content or "") if is_chat else choice.text
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    return texts, reasons


def test_n_greedy_choices_with_a_seed_are_identical(runner, client, served):
    response = runner.run(chat(client, n=3, seed=11, temperature=0))
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert len({c.message.content for c in response.choices}) == 1
    single = runner.run(chat(client, seed=11, temperature=0))
    assert response.choices[0].message.content == single.choices[0].message.content
    assert response.usage.completion_tokens == 3 * single.usage.completion_tokens
    assert response.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    assert served.admission.in_use == 0


def test_choice_j_samples_with_seed_plus_j(runner, client):
    response = runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=6, n=3, seed=40,
                                                    temperature=1.0))
    for j, choice in enumerate(response.choices):
        alone = runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=6, seed=40 + j,
                                                     temperature=1.0))
        assert choice.text == alone.choices[0].text


@pytest.mark.parametrize("is_chat", [True, False])
def test_streamed_choices_carry_their_index(runner, client, is_chat):
    if is_chat:
        stream = runner.run(chat(client, n=2, seed=5, temperature=0, stream=True,
                                 stream_options={"include_usage": True}))
    else:
        stream = runner.run(client.completions.create(model=SERVED_ID, prompt="hello", max_tokens=4, n=2, seed=5,
                                                      temperature=0, stream=True,
                                                      stream_options={"include_usage": True}))
    chunks = runner.run(collect(stream))
    texts, reasons = streamed_texts(chunks, 2, is_chat)
    assert texts[0] == texts[1] and texts[0] and reasons == ["length", "length"]
    usage = [chunk.usage for chunk in chunks if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 8
    assert len({chunk.id for chunk in chunks}) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_batched_prompts_number_choices_prompt_by_prompt(runner, client, stream):
    prompts = ["hello", "the quick brown fox"]
    singles = [runner.run(client.completions.create(model=SERVED_ID, prompt=p, max_tokens=3, temperature=0))
               for p in prompts]
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=prompts, max_tokens=3, n=2,
                                                    temperature=0, stream=stream))
    if stream:
        texts, _ = streamed_texts(runner.run(collect(response)), 4, False)
    else:
        assert [c.index for c in response.choices] == [0, 1, 2, 3]
        texts = [c.text for c in response.choices]
        assert response.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert texts == [singles[0].choices[0].text] * 2 + [singles[1].choices[0].text] * 2
    ids = runner.run(client.completions.create(model=SERVED_ID, prompt=[[5, 6, 7], [8, 9]], max_tokens=2,
                                               temperature=0))
    assert len(ids.choices) == 2
    one = runner.run(client.completions.create(model=SERVED_ID, prompt=["hello"], max_tokens=3, temperature=0))
    assert [c.text for c in one.choices] == [singles[0].choices[0].text]


def test_choice_limits_and_best_of(runner, client):
    with pytest.raises(openai.BadRequestError, match="at most 16"):
        runner.run(client.completions.create(model=SERVED_ID, prompt=["a"] * 9, n=2, max_tokens=2))
    with pytest.raises(openai.BadRequestError, match="best_of"):
        runner.run(client.completions.create(model=SERVED_ID, prompt="a", n=2, best_of=3, max_tokens=2))
    same = runner.run(client.completions.create(model=SERVED_ID, prompt="a", n=2, best_of=2, max_tokens=2))
    assert len(same.choices) == 2
    with pytest.raises(openai.BadRequestError, match="n"):
        runner.run(chat(client, n=17))
    with pytest.raises(openai.BadRequestError, match="empty"):
        runner.run(client.completions.create(model=SERVED_ID, prompt=[], max_tokens=2))


def reused_tokens(runner, served) -> float:
    async def get():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(served)),
                                     base_url="http://test") as http:
            return (await http.get("/metrics")).text
    for line in runner.run(get()).splitlines():
        if line.startswith("helios_prefix_reused_tokens"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("helios_prefix_reused_tokens not in /metrics")


@pytest.mark.parametrize("best_of", [None, 4])
def test_choices_share_the_prompt_pages(runner, client, served, best_of):
    """The prompt is computed once: the other choices reuse all of it but its last token."""
    prompt = f"({best_of}) a prompt no other test sends, to be shared by four choices"
    before = reused_tokens(runner, served)
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=prompt, max_tokens=6, n=4, seed=21,
                                                    temperature=1.0, best_of=best_of))
    num_prompt = response.usage.prompt_tokens
    assert reused_tokens(runner, served) - before == 3 * (num_prompt - 1)
    for j, choice in enumerate(response.choices):
        alone = runner.run(client.completions.create(model=SERVED_ID, prompt=prompt, max_tokens=6, seed=21 + j,
                                                     temperature=1.0))
        assert choice.text == alone.choices[0].text


WEATHER = {"type": "function", "function": {  # a short call: a random model writes it well within the context
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}},
                                          "required": ["city"], "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_prompt_is_prepared_once_for_its_choices(runner, client, served, monkeypatch, stream):
    """Template render, images, tokens and the grammar's check run once for ``n`` choices (they ran
    n times); each choice still gets a grammar matcher of its own (compiled from the first's source:
    a fork would share its lexer's limits, `test_grammar_limit_http`), with the source an engine
    process compiles it from, and tool-call ids of its own."""
    frontend, commands = served.frontend, served.commands
    prepared, submitted = [], []
    prepare_chat, submit = frontend.prepare_chat, commands.submit
    monkeypatch.setattr(frontend, "prepare_chat", lambda *a, **k: prepared.append(1) or prepare_chat(*a, **k))
    monkeypatch.setattr(commands, "submit", lambda request: submitted.append(request) or submit(request))
    response = runner.run(chat(client, n=3, seed=3, temperature=1.0, max_tokens=None, tools=[WEATHER],
                               tool_choice={"type": "function", "function": {"name": "get_weather"}},
                               stream=stream))
    assert len(prepared) == 1
    grammars = [request.grammar for request in submitted]
    assert len(grammars) == 3 and grammars[0].source is not None
    assert {grammar.source for grammar in grammars} == {grammars[0].source}
    assert len({id(grammar._matcher) for grammar in grammars}) == 3
    calls = {}
    if stream:
        for chunk in runner.run(collect(response)):
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or ():
                    if call.id:
                        calls.setdefault(choice.index, []).append(call.id)
                if choice.finish_reason is not None:
                    assert choice.finish_reason == "tool_calls"
    else:
        for choice in response.choices:
            assert choice.finish_reason == "tool_calls"
            assert [call.function.name for call in choice.message.tool_calls] == ["get_weather"]
            calls[choice.index] = [call.id for call in choice.message.tool_calls]
    assert sorted(calls) == [0, 1, 2]
    ids = [call_id for choice_ids in calls.values() for call_id in choice_ids]
    assert len(set(ids)) == len(ids)
    assert served.admission.in_use == 0


def test_batched_prompts_are_prepared_once_each(runner, client, served, monkeypatch):
    prepared = []
    prepare_completion = served.frontend.prepare_completion
    monkeypatch.setattr(served.frontend, "prepare_completion",
                        lambda body, *a, **k: prepared.append(body.prompt) or prepare_completion(body, *a, **k))
    response = runner.run(client.completions.create(model=SERVED_ID, prompt=["hello", "hello", "bye"], max_tokens=2,
                                                    n=3, temperature=0))
    assert prepared == ["hello", "hello", "bye"]
    assert [choice.index for choice in response.choices] == list(range(9))
