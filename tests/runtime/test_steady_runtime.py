"""The steady decode path through the real runtime (tiny Qwen3 core, CPU): with the steady steps
and the one-pass decode completions on, every request's tokens, log-probabilities and end equal
those of the general path, over a run where rows finish mid-cohort (lengths, EOS), one is
cancelled, one stops on the frontend's word, and new requests join the running cohort."""

from __future__ import annotations

from helios.core.reader import open_core
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
from helios.runtime.scheduling import steps
from helios.runtime.service import build_runtime
from support.server_core import tiny_core

SAMPLED = (0.8, 0.0, 0.9, 0.0, 1.0, 0.0, 0.0)


def scenario(engine) -> dict[str, list]:
    """Every request's events, in order, from one scripted run on `engine`."""
    events: dict[str, list] = {}

    def submit(request_id: str, prompt, max_tokens: int, hook=None, **options) -> None:
        events[request_id] = []

        def on_event(event) -> None:
            events[request_id].append(event)
            if hook is not None and isinstance(event, TokenEvent):
                hook(sum(len(e.token_ids) for e in events[request_id] if isinstance(e, TokenEvent)))
        engine.submit(EngineRequest(RequestSpec(request_id, tuple(prompt), max_tokens, **options), on_event))

    def joins(count: int) -> None:  # two requests join the running cohort after a's third token
        if count == 3:
            submit("late0", [21, 22, 23, 24], 5, top_logprobs=2)
            submit("late1", [31], 7, sampling=SamplingParams.from_packed(SAMPLED, 5))

    def cancels(count: int) -> None:
        if count == 4:
            engine.cancel("c")
        if count == 6:
            engine.stop_matched("d", 5)

    submit("a", [5, 6, 7], 20, joins, top_logprobs=3)
    submit("b", [9] * 11, 3)  # ends by length inside the cohort
    submit("c", [11, 12], 40, sampling=SamplingParams.from_packed(SAMPLED, 9))
    submit("d", [13, 14, 15, 16], 40, cancels)
    submit("e", [17, 18], 9, eos_ids=frozenset({0}), top_logprobs=1)
    engine.run_until_idle()
    return events


def test_steady_runtime_equals_the_general_path(tmp_path_factory, monkeypatch):
    core = tiny_core(tmp_path_factory.getbasetemp())
    runtime = build_runtime(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]))
    composed = []
    inner = steps.steady_decode
    def counted(builder, draft):
        composed.append(inner(builder, draft))
        return composed[-1]
    monkeypatch.setattr(steps, "steady_decode", counted)
    try:
        engine = runtime.engine
        runs = {}
        for fast in (True, False, True):
            engine.scheduler.builder.steady = engine.executor.array_results = engine.scheduler.plain_completion = fast
            composed.clear()
            runs.setdefault(fast, []).append(scenario(engine))
            if fast:
                assert sum(composed) > 8 and not all(composed), composed  # the steady path ran, and fell back
            else:
                assert not composed
    finally:
        runtime.close()
    steady, general = runs[True][0], runs[False][0]
    assert steady == general and runs[True][1] == steady
    ends = {request_id: events[-1].reason for request_id, events in steady.items()}
    assert ends["b"] is FinishReason.LENGTH and ends["c"] is FinishReason.CANCELLED and ends["d"] is FinishReason.STOP
    assert all(e.logprobs is not None for e in steady["a"] if isinstance(e, TokenEvent))
    assert sum(len(e.token_ids) for e in steady["late1"] if isinstance(e, TokenEvent)) == 7
