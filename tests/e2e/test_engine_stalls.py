"""An engine process whose model worker is stuck inside a round, seen through the app.

The worker runs on a thread beside the engine process's command loop, so a round that blocks without
the interpreter lock (a device sync or collective that never returns; here a wait on a
`multiprocessing.Event` in `Engine.step`, `support.engine_served.StepFault`) leaves the heartbeats
flowing: before, `/health` answered 200 while every request hung. The beats now carry the worker's
round count and whether requests are pending, so `/health` turns 503 `stalled` once requests are
pending and no round completed for the liveness timeout (cut to a moment here, with beats four times
a second), and 200 again once rounds complete. An idle engine, and one whose rounds are slow but
complete, are never stalled. States are asserted, never times: a bounded wait fails a test that
would otherwise hang, and every test releases what it held.
"""

from __future__ import annotations

import asyncio
import signal
import threading

import httpx
import pytest

from helios.server.app import create_app
from support.engine_served import HANG_GUARD_S, StepFault, asgi_client, start_served
from support.server_core import SERVED_ID, tiny_core

LIVENESS_S = 1.0  # far below the default, and four beats of `StepFault`'s
BEATS_PAST_TIMEOUT = 7  # beats spanning more than the liveness timeout (4 beats a second)


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def fault():
    return StepFault()


@pytest.fixture(scope="module")
def served(core, fault):
    # no C++ CPU kernels: their load costs seconds of CPU, and the rounds' state, not their speed, is checked here
    # (test_server's server loads them as `helios serve` does by default)
    served = start_served(core, 8, fault=fault, liveness_timeout_s=LIVENESS_S, cpu_kernels=False)
    yield served
    fault.release()
    served.shutdown()


@pytest.fixture
def app(served, fault):
    fault.release()
    fault.delay_s = 0.0
    yield create_app(served)
    fault.release()
    fault.delay_s = 0.0


def completion(max_tokens: int) -> dict:
    return {"model": SERVED_ID, "prompt": [5, 6, 7], "max_tokens": max_tokens, "temperature": 0}


async def health_until(c: httpx.AsyncClient, status: str) -> httpx.Response:
    """The first `/health` answer whose status is `status` ("ok", "stalled", ...)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_GUARD_S
    while True:
        response = await c.get("/health")
        if response.json()["status"] == status:
            return response
        assert loop.time() < deadline, f"/health stayed {response.status_code}: {response.text}"
        await asyncio.sleep(0.02)


async def watch_beats(c: httpx.AsyncClient, link, until) -> tuple[list[dict], set[float]]:
    """`/health` answers, and the beats taken while requests were pending, until `until()` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_GUARD_S
    answers, pending_beats = [], set()
    while not until():
        answers.append((await c.get("/health")).json())
        if link.shows_pending:  # the latest beat showed requests pending
            pending_beats.add(link._last_beat)
        assert link.stalled_reason is None, link.stalled_reason
        assert loop.time() < deadline, "the scenario did not end"
        await asyncio.sleep(0.02)
    return answers, pending_beats


def test_a_worker_stuck_in_a_round_with_a_request_pending_is_stalled_until_rounds_complete_again(
        served, fault, app):
    """Before: `/health` stayed 200 (the command loop kept beating) while the request hung."""

    async def scenario():
        async with asgi_client(app) as c:
            before = await health_until(c, "ok")
            fault.delay_s = 0.05  # the request is still generating when the worker is held
            request = asyncio.ensure_future(c.post("/v1/completions", json=completion(40)))
            while served.stats().active_requests == 0:  # admitted: generating
                assert not request.done(), request.result().text
                await asyncio.sleep(0.01)
            fault.hold()
            try:
                stalled = await health_until(c, "stalled")
                metrics = await c.get("/metrics")
                models = await c.get("/v1/models")
                is_healthy = served.is_healthy  # not a death: the server keeps serving
                is_pending = not request.done()
            finally:
                fault.release()
            resumed = await health_until(c, "ok")
            metrics_resumed = await c.get("/metrics")
            return before, stalled, metrics, models, is_healthy, is_pending, resumed, metrics_resumed, await request

    before, stalled, metrics, models, is_healthy, is_pending, resumed, metrics_resumed, done = asyncio.run(scenario())
    assert before.status_code == 200
    assert stalled.status_code == 503, stalled.text
    body = stalled.json()
    assert body["status"] == "stalled" and "completed no step" in body["reason"], body
    assert "with requests pending" in body["reason"] and f"more than {LIVENESS_S:g} s" in body["reason"], body
    assert "helios_healthy 0.0" in metrics.text and "helios_healthy 1.0" in metrics_resumed.text  # as /health
    assert is_healthy and is_pending and models.status_code == 200
    assert resumed.status_code == 200 and resumed.json() == {"status": "ok"}
    assert done.status_code == 200, done.text  # the held request completes once released
    assert done.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_an_idle_engine_is_never_stalled_even_with_its_worker_held(served, fault, app):
    """No request pending: the round count stands still for many liveness timeouts, and that is no
    stall (a held worker would stick in its next round, but an idle one starts none)."""
    link = served.engine
    fault.hold()

    async def scenario():
        async with asgi_client(app) as c:
            await health_until(c, "ok")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + HANG_GUARD_S
            while link.shows_pending:  # a beat since an earlier test's requests ended
                assert loop.time() < deadline, "requests still pending"
                await asyncio.sleep(0.02)
            beats = {link._last_beat}
            answers = []
            while len(beats) < BEATS_PAST_TIMEOUT:
                answers.append((await c.get("/health")).json())
                assert link.stalled_reason is None and not link.shows_pending
                beats.add(link._last_beat)
                assert loop.time() < deadline, "no beats"
                await asyncio.sleep(0.02)
            return answers, await health_until(c, "ok")

    try:
        answers, final = asyncio.run(scenario())
    finally:
        fault.release()
    # a beat a loaded machine delays past the short timeout is `unresponsive`, never `stalled`
    assert {a["status"] for a in answers} <= {"ok", "unresponsive"}, answers
    assert final.status_code == 200


def test_slow_rounds_that_complete_are_never_stalled(served, fault, app):
    """Each round takes a fifth of the liveness timeout (several beats see the same count), and the
    requests generate for longer than the timeout: /health never says stalled."""
    link = served.engine
    fault.delay_s = 0.2 * LIVENESS_S

    async def scenario():
        async with asgi_client(app) as c:
            await health_until(c, "ok")
            requests = asyncio.gather(*(c.post("/v1/completions", json=completion(12)) for _ in range(2)))
            requests = asyncio.ensure_future(requests)
            answers, pending_beats = await watch_beats(c, link, requests.done)
            return answers, pending_beats, await requests

    answers, pending_beats, done = asyncio.run(scenario())
    # the beats watched showed requests pending for longer than the timeout (the rounds' sleeps
    # bound this from below: a loaded machine only lengthens it)
    assert max(pending_beats) - min(pending_beats) > LIVENESS_S, sorted(pending_beats)
    assert {a["status"] for a in answers} <= {"ok", "unresponsive"}, answers  # as above
    assert [r.status_code for r in done] == [200, 200], [r.text for r in done]
    assert [r.json()["usage"]["completion_tokens"] for r in done] == [12, 12]


def test_shutdown_ends_with_the_worker_stuck_killing_the_engine_process(served, fault, app, monkeypatch):
    """A stalled worker would not finish its round: shutdown waits the short grace an unresponsive
    engine process gets, then kills it; the request it held ends cancelled. (The module's engine
    process, last: the shutdown ends it, and the fixture's own shutdown then does nothing.)"""
    from helios.runtime import engine_link

    # the grace only delays the kill of an engine process that cannot answer: a short one here
    monkeypatch.setattr(engine_link, "UNRESPONSIVE_GRACE_S", 0.5)
    process = served.engine._process
    outcome: dict = {}

    async def scenario():
        async with asgi_client(app) as c:
            fault.hold()
            request = asyncio.ensure_future(c.post("/v1/completions", json=completion(8)))
            stalled = await health_until(c, "stalled")

            def stop() -> None:
                served.shutdown()
                outcome["ended"] = True

            stopper = threading.Thread(target=stop, daemon=True)
            stopper.start()
            await asyncio.to_thread(stopper.join, HANG_GUARD_S)
            return stalled, await asyncio.wait_for(request, HANG_GUARD_S)

    try:
        stalled, done = asyncio.run(scenario())
    finally:
        fault.release()
        if "ended" not in outcome:
            served.shutdown()
    assert stalled.json()["status"] == "stalled"
    assert outcome.get("ended")
    assert not process.is_alive() and process.exitcode == -signal.SIGKILL
    assert done.status_code == 200 and done.json()["choices"][0]["finish_reason"] == "cancelled", done.text
    assert served.admission.in_use == 0
