"""A structured output that reaches a grammar dead end mid-output, over HTTP on the tiny core: the
choice ends cleanly with ``finish_reason: "grammar_dead_end"`` and the text written so far (HTTP 200,
or a stream's final chunk then ``[DONE]``), never a 500, an ``event: error`` or a forced token; a
request beside it is untouched and the server serves on.

``start: /[b-z]{12}/ /[^\\s\\S]/`` passes the compile check (its dead end lies past the tokens the
check walks) and dead-ends once twelve letters are written: no token can follow, and the output is
not complete. Before, llguidance's error mask made the lane sample EOS, and consuming it failed the
request: HTTP 500 ``execution_error`` (``NoExtensionBias``), or ``event: error`` in a stream."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from support.server_core import assert_serving, chat_body, post_chats

DEEP_DEAD_END = {"type": "grammar", "grammar": "start: /[b-z]{12}/ /[^\\s\\S]/"}


def post(app, body: dict) -> httpx.Response:
    return post_chats(app, body)[0]


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_a_dead_end_mid_output_ends_the_choice_with_its_text_so_far(app, served, temperature):
    response = post(app, chat_body(max_tokens=60, temperature=temperature, seed=3, logprobs=True,
                                   response_format=DEEP_DEAD_END))
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "grammar_dead_end"
    text = choice["message"]["content"]
    assert re.fullmatch("[b-z]{12}", text), text  # everything the grammar allows, nothing forced after it
    tokens = choice["logprobs"]["content"]
    assert "".join(token["token"] for token in tokens) == text
    assert body["usage"]["completion_tokens"] == len(tokens) < 60
    assert_serving(app, served)


def test_a_streamed_dead_end_ends_with_its_finish_reason_and_done(app, served):
    response = post(app, chat_body(max_tokens=60, temperature=0, stream=True, response_format=DEEP_DEAD_END,
                                   stream_options={"include_usage": True}))
    assert response.status_code == 200
    text = response.text
    assert "event: error" not in text and text.rstrip().endswith("data: [DONE]")
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    reasons = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    assert reasons == ["grammar_dead_end"]
    content = "".join(c["delta"].get("content") or "" for chunk in chunks for c in chunk["choices"])
    assert re.fullmatch("[b-z]{12}", content), content
    assert 0 < chunks[-1]["usage"]["completion_tokens"] < 60
    assert_serving(app, served)


def test_a_dead_end_leaves_the_requests_beside_it_untouched(app, served):
    plain = chat_body(max_tokens=16, temperature=0)
    alone = post(app, plain).json()["choices"][0]
    responses = post_chats(app, chat_body(max_tokens=60, temperature=0, response_format=DEEP_DEAD_END),
                           plain, chat_body(max_tokens=60, temperature=0, n=2, response_format=DEEP_DEAD_END))
    assert [r.status_code for r in responses] == [200, 200, 200], [r.text for r in responses]
    beside = responses[1].json()["choices"][0]
    assert (beside["message"]["content"], beside["finish_reason"]) == (alone["message"]["content"], alone["finish_reason"])
    assert [c["finish_reason"] for r in (responses[0], responses[2]) for c in r.json()["choices"]] == \
        ["grammar_dead_end"] * 3
    assert_serving(app, served)


# In an engine process: test_engine_process's test_grammar_limits_and_a_dead_end_end_as_in_thread
# (one engine process for the limits and this dead end).


def test_a_grammar_with_a_dead_branch_is_served_and_either_branch_ends_cleanly(app, served):
    """``start: "a" /[^\\s\\S]/ | "b"`` was a 400 (the compile check tried "a" first and met the dead
    end); it is served: an answer that takes "b" ends with ``stop``, one that takes "a" with
    ``grammar_dead_end``."""
    dead_branch = {"type": "grammar", "grammar": 'start: "a" /[^\\s\\S]/ | "b"'}
    endings = set()
    for seed in range(6):
        response = post(app, chat_body(max_tokens=8, temperature=1.5, seed=seed, response_format=dead_branch))
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        endings.add((choice["message"]["content"], choice["finish_reason"]))
    assert endings == {("b", "stop"), ("a", "grammar_dead_end")}, endings  # seeds that take each branch
    assert_serving(app, served)
