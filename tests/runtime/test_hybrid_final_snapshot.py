"""The hybrid core's final snapshot after a second execution frame ran past the request's EOS.

Two frames (as a CUDA model runs, emulated on the CPU): a decode round queued behind the one that
samples a request's EOS id still feeds that token and advances the slot's recurrent state. The
request publishes its end (`publish_snapshot`); the next turn of the conversation restores that
snapshot and must give the tokens it gives on a fresh runtime (see
tests/runtime/test_final_snapshot_after_second_frame.py for the scheduler's part).
"""

from __future__ import annotations

from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from runtime.test_hybrid_runtime import PREFIX, hybrid, runtime_of  # noqa: F401

LIMIT = 8


def _run(engine, spec: RequestSpec) -> tuple[list[int], FinishReason]:
    tokens, finishes = [], []

    def on_event(event) -> None:
        if isinstance(event, TokenEvent):
            tokens.extend(event.token_ids)
        elif isinstance(event, FinishEvent):
            finishes.append(event.reason)

    engine.submit(EngineRequest(spec, on_event))
    engine.run_until_idle()
    assert len(finishes) == 1
    return tokens, finishes[0]


def _alone(hybrid, spec: RequestSpec) -> list[int]:  # noqa: F811
    runtime = runtime_of(hybrid)
    try:
        return _run(runtime.engine, spec)[0]
    finally:
        runtime.close()


def test_a_turn_restores_the_end_published_after_a_trailing_round(hybrid):  # noqa: F811
    prompt = tuple(PREFIX[:13])
    outputs = _alone(hybrid, RequestSpec("alone", prompt, LIMIT))
    end = next(i for i in range(2, LIMIT) if outputs[i] not in outputs[:i])  # its first occurrence
    turn = prompt + tuple(outputs[:end + 1]) + (50, 51, 52)
    runtime = runtime_of(hybrid)
    runtime.engine.frames = 2
    try:
        engine = runtime.engine
        first = RequestSpec("first", prompt, LIMIT, eos_ids=frozenset({outputs[end]}), publish_snapshot=True)
        assert _run(engine, first) == (outputs[:end + 1], FinishReason.EOS)
        assert engine.stats.second_frames > 0
        tokens, reason = _run(engine, RequestSpec("turn", turn, LIMIT))
        assert engine.scheduler.counters().snapshots_restored >= 1
    finally:
        runtime.close()
    assert (tokens, reason) == (_alone(hybrid, RequestSpec("turn", turn, LIMIT)), FinishReason.LENGTH)
