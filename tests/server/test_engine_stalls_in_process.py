"""`helios serve --no-engine-process`: the model worker is a thread of the serving process, with no
heartbeats, so its progress is sampled whenever `/health` or `/metrics` asks
(`helios.runtime.stall_watch`). A worker stuck inside a round (here `Engine.step` waiting on an
event, which releases the interpreter lock as a device sync does) with a request pending turns
`/health` 503 `stalled` once the samples showed it for the liveness timeout, and 200 again once a
round completes; an idle worker is never stalled. States are asserted, never times."""

from __future__ import annotations

import asyncio
import threading

import pytest

from helios.server.app import create_app
from support.engine_served import HANG_GUARD_S, asgi_client
from support.server_core import SERVED_ID, served_tiny_core

LIVENESS_S = 0.3


class _HeldStep:
    """Wraps `Engine.step`: while held, a round waits (releasing the interpreter lock) until released."""

    def __init__(self, engine):
        self._step = engine.step
        self._free = threading.Event()
        self._free.set()
        self.entered = threading.Event()
        engine.step = self

    def __call__(self, *args, **kwargs):
        if not self._free.is_set():
            self.entered.set()
            self._free.wait(HANG_GUARD_S)
        return self._step(*args, **kwargs)

    def hold(self) -> None:
        self.entered.clear()
        self._free.clear()

    def release(self) -> None:
        self._free.set()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, frontend_workers=2,
                          liveness_timeout_s=LIVENESS_S) as served:
        yield served


@pytest.fixture
def held(served):
    held = _HeldStep(served.engine)
    yield held
    held.release()
    del served.engine.step  # the class's method again


async def status_until(c, status: str) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_GUARD_S
    while True:
        answer = (await c.get("/health")).json()
        if answer["status"] == status:
            return answer
        assert loop.time() < deadline, f"/health stayed {answer}"
        await asyncio.sleep(0.02)


def test_a_worker_stuck_in_a_round_with_a_request_pending_is_stalled_until_a_round_completes(served, held):
    app = create_app(served)

    async def scenario():
        async with asgi_client(app) as c:
            held.hold()
            body = {"model": SERVED_ID, "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}
            request = asyncio.create_task(c.post("/v1/completions", json=body))
            assert await asyncio.to_thread(held.entered.wait, HANG_GUARD_S)
            stalled = await status_until(c, "stalled")
            metrics = (await c.get("/metrics")).text
            held.release()
            await status_until(c, "ok")
            return stalled, metrics, await request

    stalled, metrics, response = asyncio.run(scenario())
    assert "completed no step" in stalled["reason"] and "requests pending" in stalled["reason"]
    assert "helios_healthy 0" in metrics
    assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "length"


def test_an_idle_worker_is_never_stalled(served, held):
    app = create_app(served)

    async def scenario():
        async with asgi_client(app) as c:
            held.hold()  # no request: no round starts, nothing is pending
            answers = []
            for _ in range(int(4 * LIVENESS_S / 0.02)):
                answers.append((await c.get("/health")).json()["status"])
                await asyncio.sleep(0.02)
            return answers

    answers = asyncio.run(scenario())
    assert set(answers) == {"ok"} and len(answers) > 1


def test_a_request_arriving_while_the_worker_is_stalled_is_refused_503_until_it_serves_again(served, held):
    app = create_app(served)
    body = {"model": SERVED_ID, "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}

    async def scenario():
        async with asgi_client(app) as c:
            held.hold()
            pending = asyncio.create_task(c.post("/v1/completions", json=body))
            assert await asyncio.to_thread(held.entered.wait, HANG_GUARD_S)
            await status_until(c, "stalled")
            refused = await c.post("/v1/completions", json=body)
            held.release()
            await status_until(c, "ok")
            return refused, await pending, await c.post("/v1/completions", json=body)

    refused, pending, after = asyncio.run(scenario())
    assert refused.status_code == 503
    error = refused.json()["error"]
    assert "model worker is stalled" in error["message"] and error["type"] == "service_unavailable"
    assert pending.status_code == 200 and after.status_code == 200
