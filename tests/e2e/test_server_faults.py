"""`helios serve` under faults: SIGTERM with streams still running at the drain deadline, and a
model worker that dies.

At the deadline every stream still running gets exactly one ``event: error`` ("server shutting
down") and its connection closes; the log shows a clean, logged exit without tracebacks. A dead
worker makes the server shut down and `serve` fail with `WorkerDied` (exit status 9), so a
supervisor restarts the process.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server import serve as serve_module
from helios.server.serve import ServeOptions, WorkerDied, serve
from support.server_core import SERVED_ID, ServerProcess, read_stream, tiny_core

DRAIN_S = 1  # `--drain-seconds`: the deadline's error events do not depend on its length
STREAMS = 24  # with one active at a time, about 5,000 tokens: five times the 1 s drain at 1 ms a token



def test_sigterm_ends_running_streams_with_one_error_event_and_exits_cleanly(tmp_path_factory, tmp_path):
    # The engine in the serving process, which ends the responses at the deadline whichever process runs the
    # engine (one process's imports and load, not two): test_lifecycle_faults' second SIGINT ends running streams
    # the same way (`interrupt_responses`) with the engine process, and test_engine_hangs' SIGTERM reaches the
    # drain deadline with requests held in the engine process's pipe. The generation is bounded by the drain's time,
    # not its tokens: `--cpu-kernels off` saves the kernels' load (seconds of CPU), and test_server's server loads
    # them as `helios serve` does by default.
    process = ServerProcess(tiny_core(tmp_path_factory.getbasetemp()), "--max-active", "1", "--queue-capacity", "64",
                            "--drain-seconds", str(DRAIN_S), "--no-engine-process", "--cpu-kernels", "off",
                            log=tmp_path / "server.log")
    events = [threading.Event() for _ in range(STREAMS)]
    with ThreadPoolExecutor(STREAMS) as pool:
        futures = [pool.submit(read_stream, process.url, started) for started in events]
        for started in events:
            assert started.wait(30)
        time.sleep(0.3)
        process.process.send_signal(signal.SIGTERM)
        texts = [future.result(timeout=60) for future in futures]
    code, log = process.terminate()
    cut = [text for text in texts if "event: error" in text]
    for text in texts:
        finished = text.rstrip().endswith("data: [DONE]")
        assert finished or (text.count("event: error") == 1 and "server shutting down" in text), text[-300:]
    assert cut, "no stream was still running at the drain deadline"
    for text in cut:
        error = json.loads(text.split("event: error\ndata: ", 1)[1].split("\n", 1)[0])
        assert error["error"]["type"] == "server_shutting_down" and error["error"]["code"] == 503
    assert code == -signal.SIGTERM
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]
    assert "drain deadline" in log and "helios serve: shut down" in log and "Application shutdown complete" in log


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_model_worker_stops_the_server_with_a_failure(tmp_path_factory, monkeypatch):
    core = tiny_core(tmp_path_factory.getbasetemp())
    runtime = build_runtime(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]),
                            RuntimeOptions(LoadOptions(cpu_kernels=False), queue_capacity=4))  # 2 tokens: no kernels

    def broken_schedule():
        raise RuntimeError("scheduler invariant violated")

    monkeypatch.setattr(runtime.engine.scheduler, "schedule", broken_schedule)
    sockets = []
    bind = serve_module.bind
    monkeypatch.setattr(serve_module, "bind", lambda host, port: sockets.append(bind(host, port)) or sockets[-1])
    outcome = {}

    def run():
        try:
            outcome["code"] = serve(runtime, ServeOptions(port=0, drain_seconds=1))
        except WorkerDied as error:
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while not sockets and time.monotonic() < deadline:
        time.sleep(0.01)
    url = "http://127.0.0.1:%d" % sockets[0].getsockname()[1]
    body = {"model": SERVED_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    for _ in range(600):
        try:
            response = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
            break
        except httpx.TransportError:
            time.sleep(0.05)
    assert response.status_code == 500 and "model worker failed" in response.json()["error"]["message"]
    thread.join(30)
    runtime.close()
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), WorkerDied) and WorkerDied.exit_code == 9


def test_a_server_whose_stdout_reader_went_away_keeps_serving(tmp_path_factory, tmp_path):
    """`helios serve ... | true`: the listening line, printed after the whole load, met a broken pipe
    and the loaded server ended with status 141. It is best effort now, as the progress lines are."""
    import os
    import socket
    import subprocess
    import sys

    core = tiny_core(tmp_path_factory.getbasetemp())
    with socket.socket() as probe:  # a free port: the listening line that names it is never read
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reader, writer = os.pipe()
    os.close(reader)  # the reader went away before the server printed anything
    log = tmp_path / "server.log"
    command = [sys.executable, "-m", "helios.cli.main", "serve", str(core.path), "--accept", core.namespace,
               "--trust", str(core.public_key), "--port", str(port), "--log-level", "info",
               "--no-engine-process", "--cpu-kernels", "off"]
    with open(log, "w") as stderr:
        process = subprocess.Popen(command, stdout=writer, stderr=stderr)
    os.close(writer)
    try:
        body = {"model": SERVED_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        response = None
        deadline = time.monotonic() + 120
        while response is None and process.poll() is None and time.monotonic() < deadline:
            try:
                response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30)
            except httpx.TransportError:
                time.sleep(0.05)
        assert process.poll() is None, (process.returncode, log.read_text()[-2000:])
        assert response is not None and response.status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert "Traceback" not in text and "BrokenPipe" not in text and "Exception ignored" not in text, text[-2000:]
    assert "standard output cannot be written" in text  # said once, not hidden
    assert "Application shutdown complete" in text
