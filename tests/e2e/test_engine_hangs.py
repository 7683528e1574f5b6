"""An engine process that is alive but not serving (stopped by SIGSTOP), seen through the app.

Its command loop sends a heartbeat every second; here the liveness timeout is cut to a moment, so a
stopped engine process turns `/health` into a 503 naming why, and SIGCONT turns it back. Shutdown
with the engine process stopped and its pipe full (the serving end's send buffer shrunk, as in
tests/e2e/test_engine_faults.py) used to wait forever on the link's send lock, held by the write
blocked on that pipe; it must end, killing the engine process. States are asserted, never times; a
bounded wait fails a test that would otherwise hang, and every test resumes what it stopped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import pytest

from helios.runtime.engine_link import unread_bytes
from helios.server.app import create_app
from support.engine_served import HANG_GUARD_S, asgi_client, shrink_send_buffer, start_served
from support.server_core import SERVED_ID, tiny_core
from support.sweeps import swept

# `--cpu-kernels off` (`cpu_kernels=False`): the loads skip building (or loading from Inductor's cache) the C++ CPU
# kernels, seconds of CPU; what is checked here (a few tokens at most) does not depend on them, and test_server's
# server loads them as `helios serve` does by default.
LIVENESS_S = 1.5  # far below the default: a stopped engine process is unresponsive within the test
REQUESTS = 24  # each command ~0.5 KiB: several times what the shrunk pipe holds


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


async def health_until(c: httpx.AsyncClient, status_code: int) -> httpx.Response:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_GUARD_S
    while True:
        response = await c.get("/health")
        if response.status_code == status_code:
            return response
        assert loop.time() < deadline, f"/health stayed {response.status_code}: {response.text}"
        await asyncio.sleep(0.05)


def resume(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def test_health_is_a_503_while_the_engine_process_is_stopped_and_200_again_once_it_resumes(core):
    """Before: `/health` answered 200 with the engine process stopped (a supervisor could not tell)."""
    served = start_served(core, 4, liveness_timeout_s=LIVENESS_S, cpu_kernels=False)
    app = create_app(served)
    pid = served.engine._process.pid

    async def scenario():
        async with asgi_client(app) as c:
            before = await health_until(c, 200)  # a loaded machine may delay a beat past the short bound
            os.kill(pid, signal.SIGSTOP)
            try:
                stopped = await health_until(c, 503)
                metrics = await c.get("/metrics")
                models = await c.get("/v1/models")
                is_healthy = served.is_healthy  # not a death: the server keeps serving
            finally:
                resume(pid)
            resumed = await health_until(c, 200)
            metrics_resumed = await c.get("/metrics")
            completion = await c.post("/v1/completions", json={
                "model": SERVED_ID, "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0})
            return before, stopped, metrics, models, is_healthy, resumed, metrics_resumed, completion

    try:
        before, stopped, metrics, models, is_healthy, resumed, metrics_resumed, completion = asyncio.run(scenario())
    finally:
        resume(pid)
        served.shutdown()
    assert before.status_code == 200 and before.json() == {"status": "ok"}
    body = stopped.json()
    assert body["status"] == "unresponsive" and "stopped or hung" in body["reason"], body
    assert is_healthy and models.status_code == 200
    assert "helios_healthy 0.0" in metrics.text and "helios_healthy 1.0" in metrics_resumed.text  # as /health
    assert resumed.json() == {"status": "ok"}
    assert completion.status_code == 200, completion.text
    assert not served.engine._process.is_alive() and served.engine._process.exitcode == 0  # a clean stop


# With HELIOS_ENGINE_HANG_SWEEP=1: the `helios serve` test below (..._a_sigterm_still_ends_it_with_143) takes the
# same shutdown by default (the stopped engine process's pipe filled by submissions, the send lock held by the
# write blocked on it, the engine process killed after the grace), and test_engine_stalls' shutdown test checks
# that a request the killed engine process held ends cancelled and its permit comes back; this one also checks
# that the pipe was full and that every request ended cancelled.
if swept("HELIOS_ENGINE_HANG_SWEEP"):
    def test_shutdown_ends_with_the_engine_process_stopped_and_its_pipe_full(core, monkeypatch):
        """Before: `EngineLink.shutdown` waited for the send lock, held by the command write blocked on
        the full pipe of the stopped engine process: forever."""
        from helios.runtime import engine_link

        # the grace only delays the kill of an engine process that cannot answer: a short one here
        monkeypatch.setattr(engine_link, "UNRESPONSIVE_GRACE_S", 0.5)
        served = start_served(core, REQUESTS + 4, liveness_timeout_s=LIVENESS_S, cpu_kernels=False)
        app = create_app(served)
        process = served.engine._process
        connection = served.engine._connection
        shrink_send_buffer(connection)
        outcome: dict = {}

        async def fill() -> list:
            async with asgi_client(app) as c:
                os.kill(process.pid, signal.SIGSTOP)
                requests = [asyncio.ensure_future(c.post("/v1/completions", json={
                    "model": SERVED_ID, "prompt": [3 + k] * 250, "max_tokens": 2, "temperature": 0}))
                    for k in range(REQUESTS)]
                loop = asyncio.get_running_loop()
                deadline = loop.time() + HANG_GUARD_S
                while not (served.admission.in_use == REQUESTS and unread_bytes(connection) > 0
                           and served.commands.num_queued > 0):  # the pipe is full: commands wait
                    assert loop.time() < deadline, "the pipe never filled"
                    await asyncio.sleep(0.01)
                unresponsive = await health_until(c, 503)

                def stop() -> None:  # what the app's lifespan does after the HTTP drain
                    served.shutdown()
                    outcome["ended"] = True

                stopper = threading.Thread(target=stop, daemon=True)
                stopper.start()
                await asyncio.to_thread(stopper.join, HANG_GUARD_S)
                if "ended" not in outcome:
                    return unresponsive, []
                done = await asyncio.wait_for(asyncio.gather(*requests), HANG_GUARD_S)
                return unresponsive, done

        try:
            unresponsive, done = asyncio.run(fill())
        finally:
            resume(process.pid)  # lets a shutdown that waited on the pipe go on
            if "ended" not in outcome:
                served.shutdown()
        assert outcome.get("ended"), "shutdown waited on the stopped engine process's pipe"
        assert unresponsive.json()["status"] == "unresponsive"
        assert not process.is_alive() and process.exitcode == -signal.SIGKILL
        # every request ended (the stopped engine process generated nothing): cancelled by the shutdown
        assert [r.status_code for r in done] == [200] * REQUESTS, [r.text for r in done if r.status_code != 200]
        assert {r.json()["choices"][0]["finish_reason"] for r in done} == {"cancelled"}
        assert served.admission.in_use == 0


def engine_pid_of(server_pid: int) -> int:
    """The engine process among `helios serve`'s children (multiprocessing's spawned one)."""
    children = []
    for task in os.listdir(f"/proc/{server_pid}/task"):
        with open(f"/proc/{server_pid}/task/{task}/children") as listing:
            children.extend(int(pid) for pid in listing.read().split())
    engines = []
    for pid in children:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            words = cmdline.read().split(b"\0")
        if any(b"spawn_main" in word for word in words) and not any(b"resource_tracker" in w for w in words):
            engines.append(pid)
    assert len(engines) == 1, (children, engines)
    return engines[0]


def test_helios_serve_reports_a_stopped_engine_process_and_a_sigterm_still_ends_it_with_143(core, tmp_path):
    """`helios serve --liveness-timeout`: /health turns 503 with the engine process stopped; with
    its pipe filled by submissions meanwhile, SIGTERM still ends the server (before: shutdown
    waited on the send lock forever), by the signal, the engine process killed."""
    import subprocess

    from support.server_core import ServerProcess

    # a short drain: the flood waits on the stopped engine process until the drain deadline either way
    server = ServerProcess(core, "--liveness-timeout", str(LIVENESS_S), "--queue-capacity", "300",
                           "--drain-seconds", "1", "--cpu-kernels", "off", log=tmp_path / "server.log")
    engine_pid = None
    try:
        engine_pid = engine_pid_of(server.process.pid)
        with httpx.Client(base_url=server.url, timeout=HANG_GUARD_S) as http:
            os.kill(engine_pid, signal.SIGSTOP)
            num_requests = 240  # ~1.3 KiB of command each: more than the pipe's buffers hold

            async def flood() -> list:
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
                async with httpx.AsyncClient(base_url=server.url, timeout=HANG_GUARD_S, limits=limits) as c:
                    return await asyncio.gather(*(c.post("/v1/completions", json={
                        "model": SERVED_ID, "prompt": [3 + k % 50] * 250, "max_tokens": 2})
                        for k in range(num_requests)), return_exceptions=True)

            answers: list = []
            flooding = threading.Thread(target=lambda: answers.extend(asyncio.run(flood())), daemon=True)
            flooding.start()
            in_use = f"helios_admission_permits_in_use {num_requests}.0"
            for _ in range(int(HANG_GUARD_S / 0.05)):
                health = http.get("/health")
                if health.status_code == 503 and in_use in http.get("/metrics").text:
                    break
                time.sleep(0.05)
            assert health.status_code == 503 and in_use in http.get("/metrics").text, health.text
            assert health.json()["status"] == "unresponsive"
        server.process.send_signal(signal.SIGTERM)
        try:
            code = server.process.wait(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail("helios serve did not exit: its shutdown waited on the stopped engine process")
        flooding.join(HANG_GUARD_S)
        log = server.log.read_text()
        assert code == -signal.SIGTERM and "helios serve: shut down" in log and "Traceback" not in log, log
        assert not os.path.exists(f"/proc/{engine_pid}") or open(f"/proc/{engine_pid}/stat").read().split()[2] == "Z"
        assert len(answers) == num_requests
        assert all(isinstance(a, httpx.Response) and a.status_code == 503 for a in answers), \
            {repr(a)[:120] for a in answers if not isinstance(a, httpx.Response) or a.status_code != 503}
    finally:
        if engine_pid is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(engine_pid, sig)
                except ProcessLookupError:
                    pass
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
        server.process.stdout.close()
