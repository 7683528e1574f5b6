"""A structured output whose grammar meets one of llguidance's limits mid-output, over HTTP on the
tiny core: the choice ends cleanly with ``finish_reason: "grammar_limit"`` and the text its grammar
took (HTTP 200, or a stream's final chunk then ``[DONE]``), never a 500, an ``event: error`` or a
token the grammar did not take; the requests beside it, and the other choices of its response, are
untouched and the server serves on. A limit met before any output token is an error that names it.

Both grammars pass the compile check (their first masks and tokens are fine):

- `MASK_LIMIT`: twelve letters, then one or more of 1,500 terminals. The mask after the letters
  needs the lexer to build the terminals' union and llguidance stops at its expression limit ("too
  many expressions constructed"); its error mask allows only EOS.
- `TOKEN_LIMIT` (`test_grammar_limits.LATE_LIMIT`): forty letters, then a hundred thousand "a". The
  mask after the letters allows "a" only; consuming it makes llguidance force the bytes after it and
  it stops at its lexer state limit ("too many states").

Before, the error mask's EOS (the first) or the refused "a" (the second) was written as an output
token and the request then failed: HTTP 500 ``execution_error``, or ``event: error`` in a stream."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from support.server_core import assert_serving, chat_body, post_chats

from server.test_grammar_limits import LATE_LIMIT, many_terminals_lark

MASK_LIMIT = {"type": "grammar", "grammar": many_terminals_lark().replace("start: t*", "start: /[b-z]{12}/ t+", 1)}
TOKEN_LIMIT = LATE_LIMIT
# What each lets an output hold before its limit: the letters (a token may reach past the twelfth
# into a terminal's letters and digits); at most forty letters, never the "a" after them.
GRAMMARS = {"at-a-mask": (MASK_LIMIT, "[b-z]{12}[a-z0-9]*"), "at-a-token": (TOKEN_LIMIT, "[b-z]{1,40}")}


def post(app, body: dict) -> httpx.Response:
    return post_chats(app, body)[0]


def finished(app, reason: str) -> float:
    """The server's ``helios_requests_finished_total`` count for `reason` (its label is there from
    the start, at zero)."""
    import asyncio

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return (await client.get("/metrics")).text

    text = asyncio.run(scenario())
    return float(re.search(r'^helios_requests_finished_total\{[^}]*reason="%s"[^}]*\} (\S+)$' % reason, text,
                           re.M).group(1))


@pytest.mark.parametrize("temperature", [0, 1.0])
@pytest.mark.parametrize("name", list(GRAMMARS))
def test_a_limit_mid_output_ends_the_choice_with_the_text_its_grammar_took(app, served, name, temperature):
    grammar, letters = GRAMMARS[name]
    before = finished(app, "grammar_limit")
    response = post(app, chat_body(max_tokens=120, temperature=temperature, seed=3, logprobs=True,
                                   response_format=grammar))
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "grammar_limit"
    text = choice["message"]["content"]
    assert re.fullmatch(letters, text), text  # what the grammar took; nothing forced or refused after it
    tokens = choice["logprobs"]["content"]
    assert "".join(token["token"] for token in tokens) == text
    assert body["usage"]["completion_tokens"] == len(tokens) < 120
    assert finished(app, "grammar_limit") == before + 1
    assert_serving(app, served)


@pytest.mark.parametrize("name", list(GRAMMARS))
def test_a_streamed_limit_ends_with_its_finish_reason_and_done(app, served, name):
    grammar, letters = GRAMMARS[name]
    response = post(app, chat_body(max_tokens=120, temperature=0, stream=True, logprobs=True, response_format=grammar,
                                   stream_options={"include_usage": True}))
    assert response.status_code == 200
    text = response.text
    assert "event: error" not in text and text.rstrip().endswith("data: [DONE]")
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    reasons = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    assert reasons == ["grammar_limit"]
    content = "".join(c["delta"].get("content") or "" for chunk in chunks for c in chunk["choices"])
    assert re.fullmatch(letters, content), content
    entries = [e for chunk in chunks for c in chunk["choices"] for e in (c.get("logprobs") or {}).get("content") or ()]
    assert "".join(entry["token"] for entry in entries) == content
    assert chunks[-1]["usage"]["completion_tokens"] == len(entries)
    assert_serving(app, served)


def test_a_limit_leaves_the_requests_and_choices_beside_it_untouched(app, served):
    plain = chat_body(max_tokens=16, temperature=0)
    alone = post(app, plain).json()["choices"][0]
    responses = post_chats(app, chat_body(max_tokens=120, temperature=0, response_format=MASK_LIMIT), plain,
                           chat_body(max_tokens=120, temperature=0.8, seed=5, n=3, response_format=TOKEN_LIMIT),
                           chat_body(max_tokens=60, temperature=0, stream=True, response_format=TOKEN_LIMIT))
    assert [r.status_code for r in responses] == [200] * 4, [r.text for r in responses]
    beside = responses[1].json()["choices"][0]
    assert (beside["message"]["content"], beside["finish_reason"]) == (alone["message"]["content"], alone["finish_reason"])
    choices = [c for r in (responses[0], responses[2]) for c in r.json()["choices"]]
    assert [c["finish_reason"] for c in choices] == ["grammar_limit"] * 4
    assert re.fullmatch(GRAMMARS["at-a-mask"][1], choices[0]["message"]["content"])
    assert all(re.fullmatch(GRAMMARS["at-a-token"][1], c["message"]["content"]) for c in choices[1:])
    assert '"finish_reason":"grammar_limit"' in responses[3].text and "event: error" not in responses[3].text
    assert_serving(app, served)


def test_the_openai_client_reads_grammar_limit_as_its_finish_reason(app, served):
    """``grammar_limit`` is a Helios finish reason beside OpenAI's, as ``grammar_dead_end`` is: the
    official client's own parsing keeps it, streamed or not, with n=2."""
    import asyncio

    from support.server_core import SERVED_ID, openai_client

    fields = dict(model=SERVED_ID, messages=[{"role": "user", "content": "hello"}], max_tokens=120, temperature=0,
                  n=2, response_format=MASK_LIMIT)

    async def scenario():
        client = openai_client(served)
        response = await client.chat.completions.create(**fields)
        reasons = {}
        async for chunk in await client.chat.completions.create(**fields, stream=True):
            reasons.update({c.index: c.finish_reason for c in chunk.choices if c.finish_reason})
        return response, reasons

    response, streamed = asyncio.run(scenario())
    assert [c.finish_reason for c in response.choices] == ["grammar_limit"] * 2
    assert all(re.fullmatch(GRAMMARS["at-a-mask"][1], c.message.content) for c in response.choices)
    assert streamed == {0: "grammar_limit", 1: "grammar_limit"}
    assert_serving(app, served)


def test_a_grammar_with_an_endless_branch_is_served_and_either_branch_ends_cleanly(app, served):
    """``start: "d" | ("a")* /[^\\s\\S]/`` was a 400 (the check's walk took "a", after which
    llguidance forces "a" for ever and runs out of parser items); it is served: an answer that takes
    "d" ends with ``stop``, one that takes "a" meets that limit at the next "a" and ends with
    ``grammar_limit`` and the "a" its grammar took."""
    endless_branch = {"type": "grammar", "grammar": 'start: "d" | ("a")* /[^\\s\\S]/'}
    endings = set()
    for seed in range(6):
        response = post(app, chat_body(max_tokens=8, temperature=1.5, seed=seed, response_format=endless_branch))
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        endings.add((choice["message"]["content"], choice["finish_reason"]))
    assert endings == {("d", "stop"), ("a", "grammar_limit")}, endings  # seeds that take each branch
    # The choices of one response (choice j samples with seed + j) end each its own way.
    for stream in (False, True):
        response = post(app, chat_body(max_tokens=8, temperature=1.5, seed=2, n=6, stream=stream,
                                       response_format=endless_branch))
        assert response.status_code == 200, response.text
        if stream:
            chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
            reasons = {c["index"]: c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]}
        else:
            reasons = {c["index"]: c["finish_reason"] for c in response.json()["choices"]}
        assert reasons == {0: "grammar_limit", 1: "grammar_limit", 2: "grammar_limit", 3: "stop", 4: "stop",
                           5: "stop"}, reasons
    assert_serving(app, served)


class _LimitAtFirstMask:
    """A request's real matcher that meets a lexer limit at its first mask, as a grammar whose
    limit the compile check did not see would (llguidance's contract: the error state's mask
    allows only EOS)."""

    def __init__(self, matcher):
        self._matcher = matcher
        self.error = ""

    def __getattr__(self, name):
        return getattr(self._matcher, name)

    @property
    def is_error(self) -> bool:
        return bool(self.error)

    @property
    def is_dead_end(self) -> bool:
        return False

    def fill_bitmask(self, out) -> None:
        self._matcher.fill_bitmask(out)
        self.error = "lexer error: too many states: 50000 >= 50000\n<state>\n..."
        out[:] = 0

    def consume_token(self, token_id: int) -> bool:
        return False


@pytest.mark.parametrize("stream", [False, True])
def test_a_limit_before_any_output_is_an_error_that_names_it(app, served, monkeypatch, stream):
    from helios.runtime.feedback import TensorGrammar
    from helios.server import service

    monkeypatch.setattr(service, "TensorGrammar", lambda matcher: TensorGrammar(_LimitAtFirstMask(matcher)))
    response = post(app, chat_body(max_tokens=30, temperature=0, stream=stream, response_format=TOKEN_LIMIT))
    expected = "the output grammar exceeded llguidance's limits before any output: lexer error: too many states"
    if stream:
        text = response.text
        assert text.count("event: error") == 1 and "[DONE]" not in text and '"finish_reason":"' not in text
        error = json.loads(text.split("event: error", 1)[1].split("data: ", 1)[1].split("\n", 1)[0])["error"]
    else:
        assert response.status_code == 500, response.text
        error = response.json()["error"]
    assert error["type"] == "execution_error" and error["message"].startswith(expected), error
    monkeypatch.undo()
    assert_serving(app, served)


# The same limits in an engine process (the grammar compiled again there, beside test_grammar_dead_end_http's dead
# end): test_engine_process's test_grammar_limits_and_a_dead_end_end_as_in_thread, on that module's engine process.
