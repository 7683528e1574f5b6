"""`helios serve` shutdown: SIGTERM with a response in flight.

uvicorn stops accepting at once and lets open responses finish within the drain period; the
in-flight stream completes, then the app stops the model worker and the process ends by the signal.
"""

from __future__ import annotations

import json
import signal
import time

import httpx

from support.server_core import SERVED_ID, ServerProcess, tiny_core


def refuses_connections(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=5)
    except httpx.TransportError:
        return True
    return False


def test_sigterm_drains_the_response_in_flight_and_refuses_new_connections(tmp_path_factory, tmp_path):
    process = ServerProcess(tiny_core(tmp_path_factory.getbasetemp()), log=tmp_path / "server.log")
    body = {"model": SERVED_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 150,
            "temperature": 0, "stream": True}
    with httpx.Client(base_url=process.url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            process.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while not refuses_connections(process.url):
                assert time.monotonic() < deadline, "the server kept accepting connections"
                time.sleep(0.02)
            rest = "\n".join(lines)
    events = [line[6:] for line in rest.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    code, log = process.terminate()
    assert code == -signal.SIGTERM and "Application shutdown complete" in log, log
