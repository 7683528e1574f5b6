"""The model worker's edges seen through the app: shutdown, a worker that dies, and a request from
the engine API that no frontend validated.

Each test serves a fresh engine built on one loaded model (the engines never run at once), so a
test can stop or kill its worker without affecting the others.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from helios.core.reader import open_core
from helios.runtime.engine import Engine, EngineRequest
from helios.runtime.execution.executor import Executor
from helios.runtime.execution.program_variants import program_table
from helios.runtime.execution.geometry import capacities_for
from helios.runtime.loading.model import load_model
from helios.runtime.execution.packer import Packer
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.scheduling.scheduler import Scheduler
from helios.runtime.service import Runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from support.server_core import SERVED_ID, tiny_core


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    return load_model(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]))


@pytest.fixture
def served(model):
    packer = Packer(model.prepared, model.buffers, max(1, model.prepared.state_rows_per_request()))
    engine = Engine(Scheduler.create(capacities_for(model, 4)), Executor(model, packer, program_table(model)))
    served = ServedModel.from_runtime(Runtime(model, engine), queue_capacity=4, frontend_workers=1)
    served.start()
    yield served
    served.shutdown()


def chat(**fields) -> dict:
    return {"model": SERVED_ID, "messages": [{"role": "user", "content": "hello"}], **fields}


def run_requests(app, *bodies: dict) -> list[httpx.Response]:
    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return [await client.post("/v1/chat/completions", json=body) for body in bodies]

    return asyncio.run(scenario())


def get(app, path: str) -> httpx.Response:
    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get(path)

    return asyncio.run(scenario())


def terminal_chunk(response: httpx.Response) -> dict:
    lines = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return json.loads(lines[-2])


def test_shutdown_ends_running_requests_cancelled_and_later_ones_at_once(served):
    app = create_app(served)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            running = asyncio.ensure_future(
                client.post("/v1/chat/completions", json=chat(max_tokens=200, temperature=0, stream=True)))
            loop = asyncio.get_running_loop()
            while served.stats().requests_admitted == 0:
                await asyncio.sleep(0.005)
            await loop.run_in_executor(None, served.shutdown)
            later = await client.post("/v1/chat/completions", json=chat(max_tokens=4))
            return await running, later

    running, later = asyncio.run(scenario())
    assert terminal_chunk(running)["choices"][0]["finish_reason"] == "cancelled"
    assert later.status_code == 200 and later.json()["choices"][0]["finish_reason"] == "cancelled"
    assert served.admission.in_use == 0 and served.is_healthy


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_worker_fails_every_request_and_reports_unhealthy(served, monkeypatch):
    def broken_schedule():
        raise RuntimeError("scheduler invariant violated")

    monkeypatch.setattr(served.engine.scheduler, "schedule", broken_schedule)
    app = create_app(served)
    assert get(app, "/health").status_code == 200
    first, later, streamed = run_requests(app, chat(max_tokens=4), chat(max_tokens=4), chat(max_tokens=4, stream=True))
    assert first.status_code == 500 and "model worker failed" in first.json()["error"]["message"]
    assert later.status_code == 503 and later.json()["error"]["type"] == "server_shutting_down"
    assert streamed.status_code == 503 and "model worker died" in streamed.json()["error"]["message"]
    health = get(app, "/health")
    assert health.status_code == 503 and health.json() == {"status": "unhealthy"}
    assert "helios_healthy 0.0" in get(app, "/metrics").text
    assert served.admission.in_use == 0


def test_a_logit_bias_wider_than_the_programs_inputs_is_rejected_at_admission(model):
    """One entry more than the programs' logit-bias inputs hold is that request's rejection, not a
    packing failure inside the worker; a bias filling the inputs is served beside it."""
    packer = Packer(model.prepared, model.buffers, max(1, model.prepared.state_rows_per_request()))
    engine = Engine(Scheduler.create(capacities_for(model, 4)), Executor(model, packer, program_table(model)))
    width = engine.scheduler.caps.logit_bias_width
    assert width == model.prepared.logit_bias_width == model.buffers["logit_bias_ids"].shape[-1] > 1
    events = []
    for name, bias in (("wide", tuple((token, 1.0) for token in range(width + 1))),
                       ("full", tuple((token, -1.0) for token in range(width))), ("plain", ())):
        engine.submit(EngineRequest(RequestSpec(name, (5, 9, 14), 4, logit_bias=bias), events.append))
    engine.run_until_idle()
    finishes = {e.request_id: e for e in events if isinstance(e, FinishEvent)}
    assert finishes["wide"].reason is FinishReason.REJECTED and f"at most {width}" in finishes["wide"].message
    assert finishes["full"].reason is finishes["plain"].reason is FinishReason.LENGTH
    for name in ("full", "plain"):
        assert sum(len(e.token_ids) for e in events if isinstance(e, TokenEvent) and e.request_id == name) == 4
