"""Through the HTTP app: a core whose chat template passes prepare but runs on for one client's
conversation answers that request with a typed 500 within the template's CPU bound, and keeps
serving other requests from its one preparation worker (the render stopped and freed its slot)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from helios.core.keys import SigningKey, write_key_pair
from helios.core.reader import open_core
from helios.frontend.preparation.template import SERVING_BOUNDS
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from ignition.hf_checkpoints import QWEN3
from support.chat_checkpoint import CHAT_TEMPLATE, write_chat_checkpoint

NAMESPACE = "test.helios/template-bounds"
# Probes never say "boom": the trap passes prepare and springs on one client's text.
TRAP = ("{% if messages[0].content == 'boom' %}"
        "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}{% endif %}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("template-bounds-http")
    checkpoint = write_chat_checkpoint(QWEN3, root / "checkpoint", seed=3)
    config = checkpoint / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": TRAP + CHAT_TEMPLATE}))
    key = SigningKey.generate()
    write_key_pair(root / "publisher.key", key, [NAMESPACE])
    # the fewest programs (no mixed step, no token log-probabilities): the requests here are two short chats
    plan = CapacityPlan(context_tokens=64, prefill_tokens=16, decode_batches=(1,), mixed=False, token_logprobs=False)
    prepare_core(checkpoint, root / "model.core", key, PrepareOptions(NAMESPACE, served_id="trap", capacities=plan))
    opened = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    runtime = build_runtime(opened, RuntimeOptions(queue_capacity=2))
    model = ServedModel.from_runtime(runtime, queue_capacity=2, frontend_workers=1)
    model.start()
    try:
        yield model
    finally:
        model.shutdown()


def chat(content: str) -> dict:
    return {"model": "trap", "messages": [{"role": "user", "content": content}], "max_tokens": 2}


def test_a_runaway_template_fails_its_request_and_the_server_keeps_serving(served):
    async def scenario():
        transport = httpx.ASGITransport(app=create_app(served))
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            start = time.monotonic()
            trapped = await client.post("/v1/chat/completions", json=chat("boom"))
            trapped_after = time.monotonic() - start
            start = time.monotonic()
            fine = await client.post("/v1/chat/completions", json=chat("hello"))
            return trapped, trapped_after, fine, time.monotonic() - start

    trapped, trapped_after, fine, fine_after = asyncio.run(scenario())
    assert trapped.status_code == 500, trapped.text
    assert "exceeded a render bound" in trapped.json()["error"]["message"]
    assert trapped_after < SERVING_BOUNDS.cpu_seconds + 5.0  # before the 10 s preparation timeout
    assert fine.status_code == 200, fine.text
    assert fine_after < 5.0  # the one preparation slot was free
