"""The engine's lifecycle at its edges, over the fake model: shutdown of an engine that was never
started (driven by `run_until_idle`) or was interrupted mid-round, submissions after it, a failed
round's plan, and commands aimed at requests that already ended."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helios.contract.views import TARGET_LOGPROB_OUTPUTS
from helios.runtime.engine import Engine, EngineRequest, EngineStateError
from helios.runtime.execution.step_output import StepOutput
from helios.runtime.outlet import StepBatch
from helios.runtime.records.capacities import Operation
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.scheduling.scheduler import Scheduler

from .fake_model import FakeExecutor, reference
from .harness import assert_all_released, capacities, spec


class Stub:
    """The executor protocol over the fake model. `on_finish(plan)` runs before a plan's output is
    returned (it may raise, as a device fault or an interrupt would); `outputs(plan)` gives the
    program's named outputs."""

    def __init__(self, caps):
        vocabulary = SimpleNamespace(mask_words=4)
        self.model = SimpleNamespace(prepared=SimpleNamespace(contract=SimpleNamespace(
            model=SimpleNamespace(vocabulary=vocabulary))))
        self.images = None
        self.overlaps = False
        self._fake = FakeExecutor(caps)
        self.on_finish = lambda plan: None
        self.outputs = lambda plan: {}

    def launch(self, plan, *, alone: bool = False):
        return plan, tuple(self._fake.run(plan))

    def finish(self, handle) -> StepOutput:
        plan, results = handle
        self.on_finish(plan)
        return StepOutput(results, self.outputs(plan))


class Recorder:
    """Each request's tokens and finish events (every one of them: a second is a defect)."""

    def __init__(self):
        self.tokens: dict[str, list[int]] = {}
        self.ends: dict[str, list[FinishEvent]] = {}

    def __call__(self, event) -> None:
        if isinstance(event, TokenEvent):
            assert not self.ends.get(event.request_id), f"{event.request_id}: a token after its finish"
            self.tokens.setdefault(event.request_id, []).extend(event.token_ids)
        elif isinstance(event, FinishEvent):
            self.ends.setdefault(event.request_id, []).append(event)

    def reasons(self) -> dict[str, list[FinishReason]]:
        return {rid: [e.reason for e in ends] for rid, ends in self.ends.items()}


def engine_of(frames: int = 1, **caps_options) -> tuple[Engine, Stub]:
    caps = capacities(**caps_options)
    executor = Stub(caps)
    return Engine(Scheduler.create(caps), executor, frames=frames), executor


PROMPTS = {f"r{i}": tuple(range(3 + i, 12 + 2 * i)) for i in range(4)}


def submit_all(engine: Engine, record: Recorder, max_output: int = 40) -> None:
    for request_id, prompt in PROMPTS.items():
        engine.submit(EngineRequest(spec(request_id, prompt, max_output), record))


# -- shutdown ------------------------------------------------------------------------------------


def test_shutdown_of_an_engine_never_started_ends_its_running_queued_and_ingress_requests():
    """Two slots and a queue of one: after a round two requests run, one waits in the scheduler's
    queue and one in the ingress channel; shutdown ends all four CANCELLED, once each, and frees
    what they held."""
    engine, _ = engine_of(max_active=2, queue=1)
    record = Recorder()
    submit_all(engine, record)
    ingress = list(engine._ingress)
    engine._ingress.clear()
    engine._admit(ingress)  # what a round of `run_until_idle` does first
    assert engine.step()
    assert len(engine._ingress) >= 1 and engine.scheduler.queues.running
    engine.shutdown()
    assert record.reasons() == {rid: [FinishReason.CANCELLED] for rid in PROMPTS}
    assert_all_released(engine.scheduler)
    assert not engine.has_pending


@pytest.mark.parametrize("started", [False, True])
def test_a_request_submitted_after_shutdown_ends_at_once(started):
    engine, _ = engine_of()
    if started:
        engine.start()
    engine.shutdown()
    record = Recorder()
    engine.submit(EngineRequest(spec("late", (1, 2, 3), 4), record))
    assert record.reasons() == {"late": [FinishReason.CANCELLED]}
    assert not engine.has_pending and not engine.scheduler.has_work


def test_a_request_submitted_through_the_sink_after_shutdown_ends_at_once():
    engine, _ = engine_of()
    batches: list[StepBatch] = []
    engine.connect(batches.append)
    engine.shutdown()
    engine.submit(EngineRequest(spec("late", (1, 2, 3), 4)))
    assert [(e.request_id, e.reason) for b in batches for e in b.events] == [("late", FinishReason.CANCELLED)]


def _interrupted_then_shut_down(at_sequence: int):
    """An engine driven by `run_until_idle` over every prompt, interrupted (Ctrl-C) while plan
    `at_sequence` is finished, then shut down; (engine, its requests' recorder)."""
    engine, executor = engine_of()
    record = Recorder()
    submit_all(engine, record)

    def interrupt(plan):
        if plan.sequence == at_sequence:
            raise KeyboardInterrupt

    executor.on_finish = interrupt
    with pytest.raises(KeyboardInterrupt):
        engine.run_until_idle()
    engine.shutdown()
    return engine, record


def test_an_interrupt_mid_round_then_shutdown_ends_every_request_once():
    """Ctrl-C inside a round of `run_until_idle` (here: while the third plan is finished), then the
    caller's `shutdown` (`Runtime.close` in a `finally`): every request gets its finish event."""
    engine, record = _interrupted_then_shut_down(at_sequence=2)
    assert record.reasons() == {rid: [FinishReason.CANCELLED] for rid in PROMPTS}
    engine.submit(EngineRequest(spec("late", (1, 2, 3), 4), record))
    assert record.reasons()["late"] == [FinishReason.CANCELLED]


def test_run_until_idle_after_an_interrupted_round_and_shutdown_returns_at_once():
    """The interrupted plan stays in the scheduler's flight (work no step completes): driving the
    shut-down engine again spun 10,000 empty rounds, then raised that it did not go idle. It returns
    at once, and a later offline batch ends CANCELLED instead."""
    from helios.runtime.offline import generate

    engine, _ = _interrupted_then_shut_down(at_sequence=1)
    assert engine.scheduler.has_work  # the interrupted plan's flight
    rounds = engine.progress
    engine.run_until_idle()
    assert engine.progress == rounds
    assert [g.finish_reason for g in generate(engine, [(1, 2, 3)], 4)] == [FinishReason.CANCELLED]
    assert engine.progress == rounds


@pytest.mark.parametrize("started", [False, True])
def test_start_after_shutdown_is_refused_and_starts_no_worker(started):
    """A worker started after shutdown served an engine closed for good (and spun on a plan an
    interrupt left in flight); a second `start` ran two workers on one scheduler, and `shutdown`
    stopped one of them."""
    engine, _ = engine_of()
    if started:
        engine.start()
    engine.shutdown()
    with pytest.raises(EngineStateError, match="shut down"):
        engine.start()
    assert engine._thread is None or not engine._thread.is_alive()
    record = Recorder()
    engine.submit(EngineRequest(spec("late", (1, 2, 3), 4), record))
    assert record.reasons() == {"late": [FinishReason.CANCELLED]}


def test_a_second_start_or_synchronous_driving_of_a_started_engine_is_refused():
    engine, _ = engine_of()
    engine.start()
    worker = engine._thread
    try:
        with pytest.raises(EngineStateError, match="started already"):
            engine.start()
        with pytest.raises(EngineStateError, match="never started"):
            engine.run_until_idle()
        assert engine._thread is worker
    finally:
        engine.shutdown()
    assert not worker.is_alive()


@pytest.mark.parametrize("started", [False, True])
def test_commands_after_shutdown_are_not_kept(started):
    """Every request ended at shutdown (or at a failed worker's end, while the server goes on
    refusing requests and cancelling them): a cancel or stop aimed at one was queued for a worker
    that never takes it, one record per refused request, for the server's lifetime."""
    engine, _ = engine_of()
    if started:
        engine.start()
    engine.shutdown()
    for index in range(100):
        engine.cancel(f"r{index}")
        engine.stop_matched(f"r{index}", 1)
    assert not engine._commands
    engine.run_until_idle()


def test_shutdown_twice_and_after_the_work_ended_changes_nothing():
    engine, _ = engine_of()
    record = Recorder()
    submit_all(engine, record, max_output=3)
    engine.run_until_idle()
    engine.shutdown()
    engine.shutdown()
    assert record.reasons() == {rid: [FinishReason.LENGTH] for rid in PROMPTS}
    assert record.tokens == {rid: reference(prompt, 3) for rid, prompt in PROMPTS.items()}
    assert_all_released(engine.scheduler)


# -- a round that fails --------------------------------------------------------------------------


def test_prompt_scores_that_cannot_be_read_fail_their_plan_not_the_worker():
    """A scored prefill whose scores output is short (a program or device fault that shows only when
    the scores are read): that plan's request ends ERROR, its pages go back, the other request goes
    on to its own tokens and the engine stays healthy."""
    engine, executor = engine_of()
    executor.outputs = lambda plan: ({TARGET_LOGPROB_OUTPUTS[0]: torch.zeros(1)}
                                     if plan.operation == Operation.SCORED_PREFILL else {})
    record = Recorder()
    engine.submit(EngineRequest(spec("plain", PROMPTS["r0"], 6), record))
    engine.submit(EngineRequest(spec("scored", PROMPTS["r1"], 6, score_prompt=True), record))
    engine.run_until_idle()
    assert record.reasons() == {"plain": [FinishReason.LENGTH], "scored": [FinishReason.ERROR]}
    assert record.tokens["plain"] == reference(PROMPTS["r0"], 6) and "scored" not in record.tokens
    assert engine.is_healthy and not engine.scheduler.has_work
    assert_all_released(engine.scheduler)


def test_a_plan_that_fails_at_launch_ends_its_requests_and_the_rest_go_on():
    """The first plan (both prompts) fails at its launch: both end ERROR once, with their pages
    back; a request submitted after it runs to its own tokens."""
    engine, executor = engine_of()
    launch = executor.launch

    def fail_first(plan, *, alone=False):
        if plan.sequence == 0:
            raise RuntimeError("injected launch fault")
        return launch(plan, alone=alone)

    executor.launch = fail_first
    record = Recorder()
    for request_id in ("r0", "r1"):
        engine.submit(EngineRequest(spec(request_id, PROMPTS[request_id], 5), record))
    engine.run_until_idle()
    engine.submit(EngineRequest(spec("r2", PROMPTS["r2"], 5), record))
    engine.run_until_idle()
    assert record.reasons() == {"r0": [FinishReason.ERROR], "r1": [FinishReason.ERROR], "r2": [FinishReason.LENGTH]}
    assert "injected launch fault" in record.ends["r0"][0].message
    assert record.tokens == {"r2": reference(PROMPTS["r2"], 5)}
    assert engine.is_healthy
    assert_all_released(engine.scheduler)


class FaultyGrammar:
    """A matcher allowing every token whose `fill_bitmask` raises at its `fail_at`-th mask (None: never)."""

    def __init__(self, fail_at: int | None = None):
        self.num_fills, self.fail_at = 0, fail_at

    def fill_bitmask(self, row) -> None:
        self.num_fills += 1
        if self.num_fills == self.fail_at:
            raise RuntimeError("matcher fault")
        row.fill_(-1)

    def consume_token(self, token_id: int) -> bool:
        return True


@pytest.mark.parametrize("frames", [1, 2])
def test_a_grammar_that_raises_at_its_mask_fails_its_request_not_the_plan(frames):
    """A constrained request's matcher raises at its third mask, in a plan with a constrained and a
    plain request beside it: that request ends ERROR with its two tokens; the failure failed the
    whole plan, so both bystanders ended ERROR too."""
    engine, _ = engine_of(frames=frames)
    record = Recorder()
    engine.submit(EngineRequest(spec("faulty", PROMPTS["r0"], 6, constrained=True), record,
                                grammar=FaultyGrammar(fail_at=3)))
    engine.submit(EngineRequest(spec("constrained", PROMPTS["r1"], 6, constrained=True), record,
                                grammar=FaultyGrammar()))
    engine.submit(EngineRequest(spec("plain", PROMPTS["r2"], 6), record))
    engine.run_until_idle()
    assert record.reasons() == {"faulty": [FinishReason.ERROR], "constrained": [FinishReason.LENGTH],
                                "plain": [FinishReason.LENGTH]}
    (faulty,) = record.ends["faulty"]
    assert "matcher fault" in faulty.message and faulty.num_output_tokens == 2
    assert record.tokens == {"faulty": reference(PROMPTS["r0"], 2), "constrained": reference(PROMPTS["r1"], 6),
                             "plain": reference(PROMPTS["r2"], 6)}
    assert engine.is_healthy and engine.stats.requests_finished["error"] == 1
    assert_all_released(engine.scheduler)
    assert not engine.feedback.watching


def test_requests_the_engine_ends_as_it_shuts_down_are_counted_once_each():
    """A request still in the ingress channel at shutdown ended CANCELLED without being counted in
    `requests_finished` (one cancelled there by its client was counted)."""
    engine, _ = engine_of(max_active=2, queue=1)
    submit_all(engine, Recorder())
    ingress = list(engine._ingress)
    engine._ingress.clear()
    engine._admit(ingress)
    assert engine.step() and engine._ingress
    engine.shutdown()
    assert dict(engine.stats.requests_finished) == {"cancelled": len(PROMPTS)}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_requests_a_failed_worker_ends_are_counted_and_their_grammars_dropped(monkeypatch):
    """The worker loop fails (its scheduler raises): its requests ended ERROR uncounted, and their
    grammar matchers stayed registered until the engine was collected."""
    engine, _ = engine_of()
    record = Recorder()

    def broken_schedule():
        raise RuntimeError("scheduler invariant violated")

    monkeypatch.setattr(engine.scheduler, "schedule", broken_schedule)
    for request_id in ("r0", "r1"):
        engine.submit(EngineRequest(spec(request_id, PROMPTS[request_id], 6, constrained=True), record,
                                    grammar=FaultyGrammar()))
    engine.start()
    engine._thread.join(10.0)
    assert not engine.is_healthy
    assert record.reasons() == {"r0": [FinishReason.ERROR], "r1": [FinishReason.ERROR]}
    assert dict(engine.stats.requests_finished) == {"error": 2}
    assert not engine.feedback.watching


# -- commands and ids at the edges -----------------------------------------------------------------


def test_cancels_of_ended_requests_and_a_duplicate_id_touch_nothing_else():
    """A duplicate of a running request's id (submitted at its first token) is rejected alone;
    cancelling a request twice, or one that already ended, sends no second finish and leaves the
    others running."""
    engine, _ = engine_of()
    record, duplicate = Recorder(), Recorder()

    def at_first_token(event):
        record(event)
        if event.request_id == "r1" and not duplicate.ends:
            engine.submit(EngineRequest(spec("r1", PROMPTS["r3"], 6), duplicate))

    engine.submit(EngineRequest(spec("r0", PROMPTS["r0"], 3), record))
    engine.submit(EngineRequest(spec("r1", PROMPTS["r1"], 6), at_first_token))
    engine.submit(EngineRequest(spec("r2", PROMPTS["r2"], 6), record))
    engine.cancel("r2")
    engine.cancel("r2")
    engine.run_until_idle()
    engine.cancel("r0")
    engine.cancel("missing")
    engine.run_until_idle()
    assert record.reasons() == {"r0": [FinishReason.LENGTH], "r1": [FinishReason.LENGTH],
                                "r2": [FinishReason.CANCELLED]}
    assert duplicate.reasons() == {"r1": [FinishReason.REJECTED]} and not duplicate.tokens
    assert record.tokens == {"r0": reference(PROMPTS["r0"], 3), "r1": reference(PROMPTS["r1"], 6)}
    assert_all_released(engine.scheduler)


def test_runtime_close_stops_the_peers_even_when_the_engine_shutdown_raises():
    from helios.runtime.service import Runtime

    closed = []

    class Broken:
        def shutdown(self):
            raise RuntimeError("the wind-down failed")

    runtime = Runtime(SimpleNamespace(), Broken(), SimpleNamespace(close=lambda: closed.append(True)))
    with pytest.raises(RuntimeError, match="wind-down"):
        runtime.close()
    assert closed == [True]


def test_build_runtime_abandons_the_peers_when_the_executor_cannot_be_built(monkeypatch):
    """Rank zero loaded its shard, then its executor failed (here: host pages it cannot allocate):
    the peers started for the tensor-parallel core were left waiting for its sizing, never told."""
    from helios.runtime import service

    abandoned = []
    monkeypatch.setattr(service, "launch_peers", lambda *args: SimpleNamespace(abandon=abandoned.append))
    monkeypatch.setattr(service, "load_model", lambda core, load: SimpleNamespace(
        prepared=None, buffers=None, weights=None, state_rows_per_request=1))
    monkeypatch.setattr(service, "host_staging", lambda *args: None)
    monkeypatch.setattr(service, "Packer", lambda *args, **options: object())

    def executor_for(model, packer, host_pages):
        raise RuntimeError("cannot allocate the host pages")

    monkeypatch.setattr(service, "executor_for", executor_for)
    core = SimpleNamespace(prepared=SimpleNamespace(manifest=SimpleNamespace(ranks=2)))
    with pytest.raises(RuntimeError, match="host pages"):
        service.build_runtime(core, service.RuntimeOptions(hold_freed_memory=False))
    assert abandoned == ["RuntimeError: cannot allocate the host pages"]


def test_a_stop_matched_sent_as_the_last_request_ends_does_not_outlive_the_synchronous_run():
    """Before: a command the frontend sent while `run_until_idle` flushed its last events (a second
    stop_matched, sent as the request's STOP end arrived) stayed queued when the run returned, and
    the next run applied it to a new request of the same id, which ended STOP at once."""
    engine, _ = engine_of()
    record = Recorder()

    def stop_at_first_token_and_again_at_the_end(event):
        record(event)
        engine.stop_matched("r0", 1)  # at every event: nothing happens once the request ended

    engine.submit(EngineRequest(spec("r0", PROMPTS["r0"], 6), stop_at_first_token_and_again_at_the_end))
    engine.run_until_idle()
    assert record.reasons() == {"r0": [FinishReason.STOP]}
    again = Recorder()
    engine.submit(EngineRequest(spec("r0", PROMPTS["r1"], 6), again))
    engine.run_until_idle()
    assert again.reasons() == {"r0": [FinishReason.LENGTH]}
    assert again.tokens == {"r0": reference(PROMPTS["r1"], 6)}
    assert_all_released(engine.scheduler)
