"""The model worker in an engine process of its own (`helios.server.engine_process`), through the app.

One engine process serves the module's ordinary requests (greedy outputs equal the in-thread
engine's, a grammar compiled again in the engine process, a cancelled request, a grammar the engine
process cannot compile, grammar limits and a dead end as in-thread) and is killed by the module's
last test; the startup error starts one of its own (spawning one costs a few seconds, so there are
two). A worker loop that fails runs the link against an engine on a thread of this process (its
scheduler broken by a patch); a client that disconnects from a real `helios serve` (engine process
by default) is tests/e2e/test_server.py's.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from helios.core.reader import open_core

from helios.runtime.engine import EngineRequest
from helios.runtime.loading.model import DeviceUnavailableError, LoadOptions
from helios.runtime.records.events import FinishEvent, FinishReason
from helios.runtime.records.request import RequestSpec
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.engine_process import CoreSource, start_engine_process
from helios.server.service import ServedModel
from support.server_core import SERVED_ID, tiny_core


def _start(core, options: RuntimeOptions = RuntimeOptions(queue_capacity=4)) -> ServedModel:
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    source = CoreSource(str(core.path), core.namespace, (str(core.public_key),))
    runtime = start_engine_process(source, opened.prepared, options, torch_threads=1)
    served = ServedModel.from_runtime(runtime, queue_capacity=4, frontend_workers=1)
    served.start()
    return served


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def served(core):
    served = _start(core)
    yield served
    served.shutdown()


def chat(**fields) -> dict:
    return {"model": SERVED_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, **fields}


async def _post(app, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as client:
        return await client.post(path, json=body)


def post(app, body: dict, path: str = "/v1/chat/completions") -> httpx.Response:
    return asyncio.run(_post(app, path, body))


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_greedy_outputs_equal_the_in_thread_engine_and_grammars_compile_in_the_engine_process(served, core):
    app = create_app(served)
    body = {"model": SERVED_ID, "prompt": [5, 6, 7, 8], "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    remote = post(app, body, "/v1/completions")
    runtime = build_runtime(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]),
                            RuntimeOptions(queue_capacity=4))
    local_served = ServedModel.from_runtime(runtime, queue_capacity=4, frontend_workers=1)
    local_served.start()
    try:
        local = post(create_app(local_served), body, "/v1/completions")
    finally:
        local_served.shutdown()
    assert remote.status_code == local.status_code == 200
    assert remote.json()["choices"][0]["token_ids"] == local.json()["choices"][0]["token_ids"]
    assert remote.json()["choices"][0]["text"] == local.json()["choices"][0]["text"]

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    response_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    constrained = post(app, chat(max_tokens=200, chat_template_kwargs={"enable_thinking": False},
                                 response_format=response_format))
    assert constrained.status_code == 200, constrained.text
    content = constrained.json()["choices"][0]["message"]["content"]
    if constrained.json()["choices"][0]["finish_reason"] == "stop":
        assert set(json.loads(content)) == {"a"}
    else:  # the output limit cut the document: what there is follows the schema's start
        assert content.startswith('{"a":')
    stats = served.stats()
    assert stats.requests_finished.get("length", 0) + stats.requests_finished.get("eos", 0) >= 2
    assert stats.generated_tokens >= 8


class _Collect:
    def __init__(self):
        self.events = []

    def on_event(self, event) -> None:
        self.events.append(event)

    def on_failure(self, error, event) -> None:
        raise AssertionError(error)


class _Source:
    """A grammar the serving process holds whose source the engine process cannot compile."""

    source = '{"grammars": [{"lark_grammar": "start: ("}]}'


def submit_collected(served: ServedModel, spec: RequestSpec, grammar=None) -> _Collect:
    consumer = _Collect()
    served.output.register(spec.request_id, consumer)
    served.engine.submit(EngineRequest(spec, grammar=grammar))
    return consumer


def test_a_cancelled_request_ends_cancelled_and_frees_its_slot(served):
    cancelled = served.stats().requests_finished.get("cancelled", 0)
    consumer = submit_collected(served, RequestSpec("to-cancel", (5, 6, 7), 200))
    wait_for(lambda: consumer.events)  # generating
    served.engine.cancel("to-cancel")
    wait_for(lambda: isinstance(consumer.events[-1], FinishEvent))
    assert consumer.events[-1].reason is FinishReason.CANCELLED
    stats = served.stats()  # sent with the finish: counters and gauges already include it
    assert stats.requests_finished["cancelled"] == cancelled + 1 and stats.active_requests == 0


def test_a_grammar_the_engine_process_cannot_compile_fails_that_request_only(served):
    consumer = submit_collected(served, RequestSpec("bad-grammar", (5, 6, 7), 4, constrained=True), _Source())
    wait_for(lambda: consumer.events)
    (finish,) = consumer.events
    assert isinstance(finish, FinishEvent) and finish.reason is FinishReason.ERROR
    assert "does not compile" in finish.message
    assert post(create_app(served), chat()).status_code == 200  # the engine serves on


def test_requests_the_link_cannot_send_are_refused():
    from helios.runtime.engine_link import EngineLink

    link = EngineLink(connection=None, process=None)
    with pytest.raises(ValueError, match="sink requests only"):
        link.submit(EngineRequest(RequestSpec("r", (1,), 1), on_event=lambda event: None))
    with pytest.raises(ValueError, match="no source"):
        link.submit(EngineRequest(RequestSpec("r", (1,), 1), grammar=object()))


def test_a_submission_whose_pipe_breaks_as_the_engine_process_dies_ends_once():
    """The engine process dies while an `Admit` is written: the link's reader ends the request it
    had counted (ERROR, the model worker died), and the failed write ended it a second time."""
    from helios.runtime.engine_link import DIED, EngineLink
    from helios.runtime.outlet import StepBatch

    class Dead:
        exitcode = -9

        def join(self, timeout=None) -> None:
            pass

        def is_alive(self) -> bool:
            return False

    class Breaking:
        def send(self, message) -> None:  # what the reader thread does on the pipe's end, then the write fails
            link._has_died = True
            link._end_outstanding(FinishReason.ERROR, DIED)
            raise BrokenPipeError

    link = EngineLink(Breaking(), Dead())
    batches: list[StepBatch] = []
    link.connect(batches.append)
    link.submit(EngineRequest(RequestSpec("r", (5, 6, 7), 4)))
    finishes = [e for b in batches for e in b.events]
    assert [(e.request_id, e.reason, e.message) for e in finishes] == [("r", FinishReason.ERROR, DIED)]
    link.submit(EngineRequest(RequestSpec("late", (5, 6, 7), 4)))  # after it: ERROR at once, once
    assert [(e.request_id, e.reason) for b in batches[1:] for e in b.events] == [("late", FinishReason.ERROR)]


async def _get(app, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.get(path)


def test_a_startup_error_in_the_engine_process_is_raised_with_its_type(core):
    with pytest.raises(DeviceUnavailableError, match="models run on the CPU or on CUDA"):
        _start(core, RuntimeOptions(LoadOptions(device="meta"), queue_capacity=4))


class _Unready:
    """An engine process that never sends its ready record: `kill` ends it where `killed_by_kill`
    (one still loading), else it ends once reaped by `join` (one that crashed: its pipe closed as it
    died, and it looks alive until reaped)."""

    def __init__(self, killed_by_kill: bool):
        self.exitcode = None
        self._killed_by_kill = killed_by_kill

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        if self._killed_by_kill:
            self.exitcode = -9

    def join(self, timeout=None) -> None:
        if not self._killed_by_kill:
            self.exitcode = -9  # reaped: killed by SIGKILL (the host's out-of-memory killer)


class _Pipe:
    """The serving process's end of an unready engine process's pipe: silent, or at its end."""

    def __init__(self, ended: bool):
        self._ended = ended

    def send(self, message) -> None:
        pass

    def poll(self, timeout) -> bool:
        if not self._ended:
            time.sleep(min(timeout, 0.05))
        return self._ended

    def recv(self):
        raise EOFError

    def close(self) -> None:
        pass


def _start_unready(core, process: _Unready, pipe: _Pipe, timeout_s: float):
    from helios.server.engine_spawn import EngineSpawn

    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    source = CoreSource(str(core.path), core.namespace, (str(core.public_key),))
    return start_engine_process(source, opened.prepared, RuntimeOptions(), timeout_s=timeout_s,
                                spawned=EngineSpawn(process, pipe))


def test_an_engine_process_still_loading_at_the_startup_timeout_is_reported_as_late(core):
    """It was killed at the deadline, and the error named the kill ("killed by SIGKILL while
    starting") as if the process had died by itself."""
    from helios.errors import ExecutionError

    process = _Unready(killed_by_kill=True)
    with pytest.raises(ExecutionError, match="did not become ready within 0.2 s"):
        _start_unready(core, process, _Pipe(ended=False), timeout_s=0.2)
    assert not process.is_alive()


def test_an_engine_process_that_crashed_while_loading_is_not_reported_as_late(core):
    """Its pipe ends (end of file) before the process is reaped, so it still looked alive when the
    wait returned: the crash was reported as a startup timeout ("did not become ready within ...")."""
    from helios.errors import ExecutionError

    with pytest.raises(ExecutionError) as raised:
        _start_unready(core, _Unready(killed_by_kill=False), _Pipe(ended=True), timeout_s=30)
    assert "did not become ready" not in str(raised.value)
    assert "while starting" in str(raised.value)


def test_a_batch_crosses_the_pipe_unchanged():
    import pickle

    from helios.runtime.engine_link import batch_of, wire_events
    from helios.runtime.outlet import StepBatch
    from helios.runtime.records.events import PromptScoresEvent, TokenEvent, TokenLogprobs

    events = (PromptScoresEvent("a", 1, (TokenLogprobs(-0.5, ((3, -0.5),)),)),
              TokenEvent("a", (4, 5), 17, (TokenLogprobs(-0.1), TokenLogprobs(-0.2, ((6, -1.0),)))),
              TokenEvent("b", (7,), None), FinishEvent("a", FinishReason.EOS, 3, 2, 0),
              FinishEvent("b", FinishReason.ERROR, 3, 1, 0, "boom"))
    crossed = batch_of(pickle.loads(pickle.dumps(wire_events(StepBatch(events)))))
    assert crossed == StepBatch(events)
    assert [type(e) for e in crossed.events] == [type(e) for e in events]


class _ThreadProcess:
    """An engine 'process' that is a thread of this one (the link only joins, kills and polls it)."""

    def __init__(self, thread):
        self._thread = thread
        self.exitcode = None

    def join(self, timeout=None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def kill(self) -> None:
        raise AssertionError("the engine side should have ended by itself")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failed_worker_loop_is_reported_as_died_and_its_requests_end_with_error(core, monkeypatch):
    import multiprocessing
    import threading

    from helios.runtime.engine_link import EngineLink, serve_link
    from helios.runtime.outlet import StepBatch

    runtime = build_runtime(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]),
                            RuntimeOptions(queue_capacity=4))

    def broken_schedule():
        raise RuntimeError("scheduler invariant violated")

    monkeypatch.setattr(runtime.engine.scheduler, "schedule", broken_schedule)
    ours, theirs = multiprocessing.Pipe()
    engine_side = threading.Thread(target=serve_link, args=(theirs, runtime.engine, lambda source: None))
    engine_side.start()
    link = EngineLink(ours, _ThreadProcess(engine_side))
    batches: list[StepBatch] = []
    link.connect(batches.append)
    link.start()
    link.submit(EngineRequest(RequestSpec("doomed", (5, 6, 7), 4)))
    wait_for(lambda: not link.is_healthy)
    wait_for(lambda: any(isinstance(e, FinishEvent) for b in batches for e in b.events))
    (finish,) = [e for b in batches for e in b.events if isinstance(e, FinishEvent)]
    assert finish.request_id == "doomed" and finish.reason is FinishReason.ERROR
    assert "scheduler invariant violated" in finish.message
    link.submit(EngineRequest(RequestSpec("late", (5, 6, 7), 4)))  # after the death: ERROR at once
    late = batches[-1].events[0]
    assert late.request_id == "late" and late.reason is FinishReason.ERROR and "model worker died" in late.message
    link.shutdown()
    assert not engine_side.is_alive()
    runtime.close()


def test_the_engine_side_sends_in_order_and_holds_the_worker_back_past_max_queued():
    import threading

    from helios.runtime.engine_link import MAX_QUEUED, _BatchSender

    gate, sent = threading.Event(), []

    class SlowPipe:  # a serving process that does not read until the gate opens
        def send(self, message) -> None:
            gate.wait()
            sent.append(message)

    sender = _BatchSender(SlowPipe(), engine=None)
    sender.send(0)
    wait_for(lambda: not sender._queue)  # the sender thread holds message 0 in its write
    worker = threading.Thread(target=lambda: [sender.send(k) for k in range(1, MAX_QUEUED + 2)])
    worker.start()
    worker.join(0.5)
    assert worker.is_alive() and len(sender._queue) == MAX_QUEUED  # the last one waits for room
    gate.set()
    worker.join(10)
    sender.close()
    assert sent == list(range(MAX_QUEUED + 2))


def test_the_engine_side_writes_on_the_calling_thread_while_the_pipe_is_drained_and_queues_behind_unread_bytes():
    import multiprocessing

    from helios.runtime.engine_link import _BatchSender, unread_bytes

    ours, theirs = multiprocessing.Pipe()
    sender = _BatchSender(ours, engine=None)
    assert unread_bytes(ours) == 0
    sender.send("first")
    assert unread_bytes(ours) > 0 and not sender._queue  # written before `send` returned
    with sender._wake:  # hold the sender thread back: what cannot be written directly stays queued
        sender.send("second")  # the pipe holds unread bytes: queued for the sender thread
        assert sender._queue == ["second"]
    assert [theirs.recv(), theirs.recv()] == ["first", "second"]
    # drained and idle: the sender thread has also left its write of "second" (it may still be
    # finishing it after the reader took the bytes)
    wait_for(lambda: unread_bytes(ours) == 0 and not sender._is_writing and not sender._queue)
    sender.send("third")
    assert theirs.poll(0) and theirs.recv() == "third"
    sender.close()
    ours.close()
    theirs.close()


def test_request_text_past_the_context_bound_is_a_400_naming_messages_or_prompt(served):
    """Before: the refusal raised before tokenizing had `param: null`."""
    from helios.frontend.decoding.text_bounds import TextBounds

    app = create_app(served)
    bound = TextBounds.from_tokenizer(served.frontend._tokenizer, served.card.context_tokens).max_text_chars
    text = "a" * (bound + 1)
    chat_answer = post(app, chat(messages=[{"role": "user", "content": text}]))
    completion = post(app, {"model": SERVED_ID, "prompt": text, "max_tokens": 2}, "/v1/completions")
    for response, param in ((chat_answer, "messages"), (completion, "prompt")):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert f"more than {bound} characters" in error["message"] and error["param"] == param, error


def test_head_on_openapi_json_is_a_405_as_on_every_get_route(served):
    """Before: starlette's HEAD on FastAPI's /openapi.json route answered 200."""
    app = create_app(served)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.head("/openapi.json"), await c.head("/health"), await c.get("/openapi.json")

    head, health_head, document = asyncio.run(scenario())
    assert (head.status_code, head.headers.get("allow")) == (405, "GET")
    assert head.status_code == health_head.status_code and document.status_code == 200


def test_grammar_limits_and_a_dead_end_end_as_in_thread(served):
    """The engine process compiles each grammar again from its source; each of test_grammar_limit_http's limits, a
    dead end (test_grammar_dead_end_http's) beside them, and their finishes cross the process boundary as in-thread
    (this module's one engine process serves all three requests)."""
    import re

    from support.server_core import assert_serving, chat_body, post_chats

    from server.test_grammar_dead_end_http import DEEP_DEAD_END
    from server.test_grammar_limit_http import GRAMMARS

    app = create_app(served)
    *responses, dead_end = post_chats(app, *(chat_body(max_tokens=120, temperature=0, response_format=grammar)
                                             for grammar, _ in GRAMMARS.values()),
                                      chat_body(max_tokens=60, temperature=0, response_format=DEEP_DEAD_END))
    for response, (_, letters) in zip(responses, GRAMMARS.values(), strict=True):
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "grammar_limit" and re.fullmatch(letters, choice["message"]["content"])
    assert dead_end.status_code == 200, dead_end.text
    choice = dead_end.json()["choices"][0]
    assert choice["finish_reason"] == "grammar_dead_end" and re.fullmatch("[b-z]{12}", choice["message"]["content"])
    assert_serving(app, served)


def test_a_killed_engine_process_ends_its_requests_and_reports_unhealthy(served):
    # the module's engine process, killed last: the tests above it in this file run before it
    app = create_app(served)
    try:
        consumer = submit_collected(served, RequestSpec("running", (5, 6, 7), 200))
        wait_for(lambda: consumer.events)  # generating
        served.engine._process.kill()  # the engine process dies mid-request
        wait_for(lambda: isinstance(consumer.events[-1], FinishEvent))
        finish = consumer.events[-1]
        assert finish.reason is FinishReason.ERROR and "model worker died" in finish.message
        assert not served.is_healthy
        assert asyncio.run(_get(app, "/health")).status_code == 503
        refused = post(app, chat())  # the server cannot serve it: 503, not the 500 of a failed request
        assert refused.status_code == 503 and "model worker died" in refused.json()["error"]["message"]
        assert refused.json()["error"]["type"] == "server_shutting_down" and refused.json()["error"]["code"] == 503
        refused = post(app, {"model": SERVED_ID, "prompt": "hi", "max_tokens": 2, "n": 2}, "/v1/completions")
        assert refused.status_code == 503 and "model worker died" in refused.json()["error"]["message"]
        streamed = post(app, chat(stream=True))  # refused before its stream starts
        assert streamed.status_code == 503 and "model worker died" in streamed.json()["error"]["message"]
        assert served.admission.in_use == 0
    finally:
        started = time.monotonic()
        served.shutdown()
        assert time.monotonic() - started < 15
