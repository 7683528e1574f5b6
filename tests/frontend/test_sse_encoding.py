"""SSE byte templates: every per-token chunk rendered from a stream's `ChunkTemplate` is byte for
byte what encoding the presenter's chunk dicts gives, for chat and text streams, observed or not,
with and without usage, with non-ASCII, escaped and control characters, tool fragments and
log-probabilities (which take the dict path)."""

from __future__ import annotations

import json

import pytest

from helios.frontend.decoding.events import ContentDelta, ReasoningDelta, ToolCallArguments, ToolCallStart
from helios.frontend.decoding.logprobs import LogprobEntry
from helios.frontend.decoding.observation import ObservationOptions, TokenObservation
from helios.frontend.preparation.request_options import ResponseOptions
from helios.frontend.responses.output import OutputStep
from helios.frontend.responses.presentation import ResponseHead, ResponseKind, StreamPresenter, sse_data
from helios.frontend.responses.sse_encoding import ChunkTemplate, encode_json
from helios.frontend.responses.step_run import StepRun

TEXTS = ("Hello", " wörld ✓ 你好", 'quote " backslash \\ slash /', "tab\t newline\n nul\x00 \u2028", "😀", "")


def _steps(observed: bool, timed: bool) -> list[OutputStep]:
    steps = []
    for k, text in enumerate(TEXTS):
        observation = TokenObservation(1000 + k, 5_000_000 + k if timed else None) if observed else None
        steps.append(OutputStep(observation, (ContentDelta(text),), False))
    steps.append(OutputStep(None, (ReasoningDelta("think "), ReasoningDelta("more"), ContentDelta("answer")), False))
    steps.append(OutputStep(None, (ToolCallStart(0, "call_1", "get_weather"), ToolCallArguments(0, '{"city": "Paris"}')), False))
    steps.append(OutputStep(None, (ToolCallArguments(0, "}"),), False))
    steps.append(OutputStep(None, (), False))
    entry = LogprobEntry(7, "x", -0.5, ())
    steps.append(OutputStep(TokenObservation(7, None) if observed else None, (ContentDelta("x"),), False, (entry,)))
    return steps


def _reference(presenter: StreamPresenter, step: OutputStep) -> bytes:
    return b"".join(sse_data(chunk) for chunk in presenter.step_chunks(step))


@pytest.mark.parametrize("kind", [ResponseKind.CHAT, ResponseKind.TEXT])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("observed, timed", [(False, False), (True, False), (True, True)])
def test_template_chunks_equal_the_encoded_chunk_dicts(kind, include_usage, observed, timed):
    options = ResponseOptions(True, include_usage, ObservationOptions(observed, timed))
    head = ResponseHead("cmpl-é\"1", 1_700_000_000, 'model "ü"', kind, options, prompt_token_ids=(1, 2, 3))
    fast, reference = StreamPresenter(head), StreamPresenter(head)
    assert fast.sse_start() == b"".join(sse_data(chunk) for chunk in reference.start_chunks())
    for step in _steps(observed, timed):
        assert fast.sse_step(step) == _reference(reference, step)


def test_template_parts_decode_to_the_chunk_they_stand_for():
    template = ChunkTemplate("id-1", "text_completion", 3, "m", is_chat=False, include_usage=True)
    chunk = json.loads(template.observation(5, 9)[6:])
    assert chunk == {"id": "id-1", "object": "text_completion", "created": 3, "model": "m", "choices": [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": None, "token_ids": [5],
         "token_timestamps_ns": [9]}], "usage": None}
    assert json.loads(template.text("a\nb")[6:])["choices"][0]["text"] == "a\nb"


def test_encoder_matches_json_dumps():
    value = {"a": ["ü", 1, 2.5, None, True], "b": {"c": "\x01"}}
    assert encode_json(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("kind", [ResponseKind.CHAT, ResponseKind.TEXT])
@pytest.mark.parametrize("observed, timed", [(False, False), (True, False), (True, True)])
def test_template_chunks_of_merged_runs_equal_the_encoded_chunk_dicts(kind, observed, timed):
    options = ResponseOptions(True, False, ObservationOptions(observed, timed))
    head = ResponseHead("cmpl-2", 1_700_000_000, "m", kind, options, prompt_token_ids=(1, 2, 3))
    fast, reference = StreamPresenter(head), StreamPresenter(head)
    assert fast.sse_start() == b"".join(sse_data(chunk) for chunk in reference.start_chunks())
    steps = _steps(observed, timed)
    fast.sse_step(steps[0]), reference.step_chunks(steps[0])  # the first chunk takes the dict path
    for start, stop in ((1, 4), (4, 8), (8, len(steps) - 1), (len(steps) - 1, len(steps))):
        run = StepRun.of(steps[start:stop])
        assert fast.sse_run(run) == b"".join(sse_data(chunk) for chunk in reference.run_chunks(run))


@pytest.mark.parametrize("kind", [ResponseKind.CHAT, ResponseKind.TEXT])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("observed, timed", [(False, False), (True, False), (True, True)])
def test_plain_step_bytes_equal_the_encoded_chunk_dicts(kind, include_usage, observed, timed):
    """`sse_plain_step` (one format per step) gives the dict path's bytes for every plain step, and
    None (the caller's general path) for the first chunk, reasoning, tool calls and log-probabilities."""
    options = ResponseOptions(True, include_usage, ObservationOptions(observed, timed))
    head = ResponseHead("cmpl-é\"3", 1_700_000_000, 'model "ü"', kind, options, prompt_token_ids=(1, 2, 3))
    fast, reference = StreamPresenter(head), StreamPresenter(head)
    fast.sse_start(), reference.start_chunks()
    steps = _steps(observed, timed)
    if kind is ResponseKind.TEXT:
        assert fast.sse_plain_step(steps[0]) is None  # the first chunk (prompt ids when observed)
        assert fast.sse_step(steps[0]) == _reference(reference, steps[0])
        steps = steps[1:]
    multi = OutputStep(TokenObservation(9, 1 if timed else None) if observed else None,
                       (ContentDelta("a\""), ContentDelta("\x1fb")), False)
    plain = 0
    for step in [*steps, multi]:
        expected = _reference(reference, step)
        chunk = fast.sse_plain_step(step)
        is_plain = not step.logprobs and all(type(event) is ContentDelta for event in step.events)
        assert (chunk is not None) == is_plain
        if chunk is None:
            assert fast.sse_step(step) == expected
        else:
            assert chunk == expected
            plain += 1
    assert plain >= len(TEXTS)


def test_plain_step_waits_for_the_echo():
    """A stream with an echo still to send takes the general path until the echo is out (a chat
    stream: its role chunk is out first, so only the echo holds the plain path back)."""
    options = ResponseOptions(True, False, ObservationOptions(False, False))
    head = ResponseHead("cmpl-4", 1, "m", ResponseKind.CHAT, options, echo_text="prompt text")
    fast, reference = StreamPresenter(head), StreamPresenter(head)
    fast.sse_start(), reference.start_chunks()
    step = OutputStep(None, (ContentDelta("x"),), False)
    assert fast.sse_plain_step(step) is None
    assert fast.sse_step(step) == _reference(reference, step)
    assert fast.sse_plain_step(step) == _reference(reference, step)
