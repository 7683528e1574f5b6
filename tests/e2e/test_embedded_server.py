"""`helios serve` with no model serves the embedded default model: it answers arithmetic with its
reasoning in the reasoning field, and calls a declared tool with schema-valid arguments.

The model is prepared into a fresh cache on the server's first start, by default with one decode batch
(a driver sets `helios.embedded.prepared.DECODE_BATCHES` before `helios serve` runs): the requests here
come one at a time, so they decode in the batch of 1 with any plan, and capturing the default plan's
larger batches takes the capture path the tiny cores' batches of 4 and 8 take (tests/e2e/test_server).
HELIOS_EMBEDDED_PLAN_SWEEP=1 prepares the default plan itself and serves it from an engine process, as a user's
first start does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from openai import OpenAI

from helios.embedded import default_tools
from support.sweeps import swept

ONE_DECODE_BATCH_DRIVER = """
import sys

from helios.embedded import prepared

prepared.DECODE_BATCHES = (1,)

if __name__ == "__main__":
    from helios.cli.main import main

    sys.exit(main())
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedded")
    env = dict(os.environ, HELIOS_CACHE=str(root / "cache"), PYTHONUNBUFFERED="1")
    if swept("HELIOS_EMBEDDED_PLAN_SWEEP"):  # the default plan, DECODE_BATCHES as shipped
        command = [sys.executable, "-m", "helios.cli.main", "serve", "--port", "0"]
    else:
        driver = root / "one_decode_batch.py"
        driver.write_text(ONE_DECODE_BATCH_DRIVER)
        # the engine in the serving process: the answers are the model's whichever process runs it (test_server's
        # server runs the default engine process), and one process's imports and load are saved
        command = [sys.executable, str(driver), "serve", "--port", "0", "--no-engine-process"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    deadline = time.monotonic() + 240
    for line in process.stdout:
        if "http://" in line:
            url = "http://" + line.split("http://", 1)[1].split()[0].rstrip(".,")
            break
        if time.monotonic() > deadline:
            break
    assert url, "the server printed no address"
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    yield OpenAI(base_url=url + "/v1", api_key="unused")
    process.terminate()
    process.wait(30)


def test_arithmetic_answer_with_reasoning_in_its_field(server):
    model = server.models.list().data[0].id
    response = server.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 487 + 356?"}], temperature=0, max_tokens=120
    )
    message = response.choices[0].message
    assert message.content.strip().endswith("= 843.")
    assert "<think>" not in message.content and "</think>" not in message.content
    assert message.reasoning_content
    assert response.choices[0].finish_reason == "stop"


def test_tool_call_for_a_declared_tool(server):
    model = server.models.list().data[0].id
    response = server.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What's the weather like in Lisbon?"}],
        tools=default_tools(), temperature=0, max_tokens=120,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Lisbon"}


def test_requests_without_temperature_follow_the_greedy_recommendation(server):
    """The embedded generation_config says do_sample: false, so the core's default is greedy."""
    model = server.models.list().data[0].id
    messages = [{"role": "user", "content": "What is 12 + 30?"}]
    first, second = (server.chat.completions.create(model=model, messages=messages, max_tokens=40, seed=seed)
                     for seed in (1, 2))
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.choices[0].message.model_dump().get("reasoning_content") == \
        second.choices[0].message.model_dump().get("reasoning_content")
