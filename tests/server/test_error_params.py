"""Error bodies name the request field at fault (``param``) for refusals found while preparing a
chat request's grammar, through the app: a prompt whose rendered end leaves a frame open that the
request's constraints cannot continue is a 400 naming ``messages`` (its param was null).

The core is the harmony family's tiny checkpoint (tests/support/family_checkpoints.py) with a
template whose generation prompt can open the final channel (a ``channel`` template kwarg), as a
template that prefills a channel renders it: a structured answer cannot continue that header."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from helios.core.keys import SigningKey, write_key_pair
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from support.family_checkpoints import CASES, TEMPLATES, train_tokenizer, write_family_checkpoint

NAMESPACE = "test.helios/error-params"
HARMONY = next(case for case in CASES if case.name == "harmony")
GENERATION_PROMPT = '{%- if add_generation_prompt %}{{ "<|start|>assistant" }}{% endif %}'
OPEN_CHANNEL = ('{%- if add_generation_prompt %}{{ "<|start|>assistant" }}'
                '{%- if channel %}{{ "<|channel|>" + channel }}{% endif %}{% endif %}')
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("harmony-open-channel")
    checkpoint = write_family_checkpoint(HARMONY, train_tokenizer(HARMONY.special_tokens), root / "checkpoint")
    template = (TEMPLATES / HARMONY.template).read_text()
    assert template.count(GENERATION_PROMPT) == 1
    settings = json.loads((checkpoint / "tokenizer_config.json").read_text())
    settings["chat_template"] = template.replace(GENERATION_PROMPT, OPEN_CHANNEL)
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(settings))
    public = write_key_pair(root / "publisher.key", key := SigningKey.generate(), [NAMESPACE])
    plan = CapacityPlan(context_tokens=512, prefill_tokens=256, decode_batches=(1,), mixed=False, token_logprobs=False)
    prepare_core(checkpoint, root / "model.core", key, PrepareOptions(NAMESPACE, served_id="h", capacities=plan))
    opened = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[public])
    served = ServedModel.from_runtime(build_runtime(opened, RuntimeOptions(queue_capacity=2)), queue_capacity=2,
                                      frontend_workers=1)
    served.start()
    try:
        yield served
    finally:
        served.shutdown()


def post(served, body: dict) -> httpx.Response:
    async def call():
        transport = httpx.ASGITransport(app=create_app(served))
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as client:
            return await client.post("/v1/chat/completions", json=body)

    return asyncio.run(call())


def chat(**fields) -> dict:
    return {"model": "h", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


@pytest.mark.parametrize("fields", [
    {"response_format": SCHEMA},  # named response_format before
    {"tools": [TOOL], "tool_choice": "required"},  # named nothing (param null) before
    {"tools": [TOOL], "response_format": SCHEMA},
], ids=["answer", "forced call", "call or answer"])
def test_a_prompt_frame_the_constraints_cannot_continue_is_a_400_naming_messages(served, fields):
    assert post(served, chat(**fields)).status_code == 200  # the plain generation prompt continues
    response = post(served, chat(**fields, chat_template_kwargs={"channel": "final"}))
    error = response.json()["error"]
    assert (response.status_code, error["type"], error["param"]) == (400, "invalid_request_error", "messages"), error
    assert "open frame 'assistant<|channel|>final' cannot continue" in error["message"]
    assert served.admission.in_use == 0
    assert post(served, chat(response_format=SCHEMA)).status_code == 200  # and it keeps serving
