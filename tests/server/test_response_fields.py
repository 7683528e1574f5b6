"""Response-level fields of several choices and streams: one ``id`` per response, and the usage so
far on every chunk (vLLM's ``stream_options.continuous_usage_stats``) (`helios.server.fanout`,
`helios.server.choice_stream`, `helios.frontend.responses.presentation`)."""

from __future__ import annotations


import pytest

from support.server_core import SERVED_ID, post_json, sse_chunks


def _body(is_chat: bool, **fields) -> tuple[str, dict]:
    if is_chat:
        return "/v1/chat/completions", {"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], **fields}
    return "/v1/completions", {"model": SERVED_ID, "prompt": "hi", **fields}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("shape", ["chat_n", "text_n", "text_batch"])
def test_a_response_of_several_choices_has_the_requests_id_not_a_choices(runner, app, shape, stream):
    """One id for the whole response, as OpenAI and vLLM give (``cmpl-...``), in the body and every
    chunk: it was the first choice's engine request's (``cmpl-...-0``)."""
    fields = {"n": 2} if shape != "text_batch" else {"prompt": ["hi", "bye"]}
    path, body = _body(shape == "chat_n", max_tokens=3, stream=stream, stream_options={"include_usage": True}
                       if stream else None, **fields)
    response = runner.run(post_json(app, path, body))
    assert response.status_code == 200, response.text
    ids = {chunk["id"] for chunk in sse_chunks(response.text)} if stream else {response.json()["id"]}
    prefix = "chatcmpl-" if shape == "chat_n" else "cmpl-"
    assert len(ids) == 1, ids
    (response_id,) = ids
    assert response_id.startswith(prefix) and len(response_id) == len(prefix) + 32, response_id  # a bare uuid hex


@pytest.mark.parametrize("shape", ["chat", "text", "chat_n", "text_batch_n"])
def test_continuous_usage_grows_with_every_chunk_and_ends_at_the_final_usage(runner, app, shape):
    """vLLM's ``stream_options.continuous_usage_stats``: every chunk carries the response's usage so
    far (each prompt once, every choice's output so far); it never shrinks, and the last chunk's is
    the final usage."""
    fields = {"n": 2} if shape.endswith("_n") else {}
    if shape == "text_batch_n":
        fields["prompt"] = ["hi", "a longer prompt"]
    path, body = _body(shape.startswith("chat"), max_tokens=6, stream=True, seed=3, temperature=1.0,
                       stream_options={"include_usage": True, "continuous_usage_stats": True}, **fields)
    response = runner.run(post_json(app, path, body))
    assert response.status_code == 200, response.text
    chunks = sse_chunks(response.text)
    usages = [chunk["usage"] for chunk in chunks]
    assert all(usage is not None for usage in usages), usages
    final = usages[-1]
    assert chunks[-1]["choices"] == [] and final["completion_tokens"] == 6 * (1 + ("n" in fields)) * (
        1 + (shape == "text_batch_n"))
    completions = [usage["completion_tokens"] for usage in usages]
    assert completions == sorted(completions), completions
    if shape.startswith("chat"):
        assert completions[0] == 0  # the role chunk: nothing generated yet
    assert {usage["prompt_tokens"] for usage in usages} == {final["prompt_tokens"]}
    assert all(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] for usage in usages)
    assert usages[-2] == final  # the last choice chunk already counts every token


@pytest.mark.parametrize("is_chat", [True, False])
def test_without_continuous_usage_only_the_last_chunk_has_usage(runner, app, is_chat):
    path, body = _body(is_chat, max_tokens=4, stream=True, stream_options={"include_usage": True})
    chunks = sse_chunks(runner.run(post_json(app, path, body)).text)
    assert [chunk["usage"] is None for chunk in chunks] == [True] * (len(chunks) - 1) + [False]


@pytest.mark.parametrize("is_chat", [True, False])
def test_continuous_usage_without_include_usage_is_a_400_naming_it(runner, app, is_chat):
    path, body = _body(is_chat, max_tokens=4, stream=True, stream_options={"continuous_usage_stats": True})
    response = runner.run(post_json(app, path, body))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "stream_options.continuous_usage_stats"
