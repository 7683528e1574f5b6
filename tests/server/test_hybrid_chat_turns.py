"""Chat turns on the hybrid (Mamba2 + attention) core through the HTTP app: the first turn publishes
a snapshot where its stable prefix ends (the template re-renders the generation prompt and the
reply next turn, so its prompt boundary is not a prefix of the next prompt); the second turn
restores it (visible in /metrics) and answers exactly as a cold server does."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from helios.core.keys import SigningKey, write_key_pair
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from ignition.hf_checkpoints import BAMBA
from support.chat_checkpoint import write_chat_checkpoint
from support.server_core import SERVED_ID
from support.shared_prepare import prepared_once, shared_root

NAMESPACE = "test.helios/hybrid-chat"
QUESTION = {"role": "user", "content": "what is 12 plus 30?"}


def hybrid_chat_core(base) -> Path:
    """A small hybrid chat core: one decode batch, no mixed step, with token-logprobs programs (the one hybrid core
    that carries them: tests/runtime/test_hybrid_runtime.py's has none), prepared once per run under `base`'s shared
    root for every xdist worker (test_state_graph_chat_turns imports the `hybrid` fixture, and test_logprobs_reference
    serves this core as its hybrid, asking for it by the server tests' served id); its directory."""
    root = shared_root(base) / "hybrid-chat"

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        checkpoint = write_chat_checkpoint(BAMBA, root / "checkpoint", seed=4)
        key = SigningKey.generate()
        write_key_pair(root / "publisher.key", key, [NAMESPACE])
        # no MIXED programs: the turns here come one at a time (and the state-graphs core drops MIXED graphs)
        plan = CapacityPlan(page_tokens=8, context_tokens=128, prefill_tokens=32, decode_batches=(2,), mixed=False)
        prepare_core(checkpoint, root / "model.core.partial", key,
                     PrepareOptions(NAMESPACE, served_id=SERVED_ID, capacities=plan))
        (root / "model.core.partial").rename(root / "model.core")

    prepared_once(root, root / "model.core", prepare)
    return root


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return hybrid_chat_core(tmp_path_factory.getbasetemp())


def _served(root) -> tuple[ServedModel, str]:
    core = open_core(root / "model.core", accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    runtime = build_runtime(core, RuntimeOptions())
    served = ServedModel.from_runtime(runtime, queue_capacity=8, frontend_workers=1, owned_by=NAMESPACE)
    served.start()
    return served, runtime.model.prepared.contract.served_id


async def _call(app, method: str, path: str, body=None) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        response = await client.request(method, path, json=body)
    assert response.status_code == 200, response.text
    return response


def _chat(app, model: str, messages: list[dict]) -> tuple[dict, int]:
    """(message, completion tokens) of a greedy answer."""
    body = {"model": model, "messages": messages, "max_tokens": 12, "temperature": 0}
    answer = asyncio.run(_call(app, "POST", "/v1/chat/completions", body)).json()
    return answer["choices"][0]["message"], answer["usage"]["completion_tokens"]


def _metric(app, name: str) -> float:
    text = asyncio.run(_call(app, "GET", "/metrics")).text
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert found is not None, f"{name} is not exposed"
    return float(found.group(1))


@pytest.fixture()
def warm(hybrid):
    served, model = _served(hybrid)
    yield create_app(served), model
    served.shutdown()


def test_second_turn_restores_the_first_turns_stable_prefix(hybrid, warm):
    app, model = warm
    reply, _ = _chat(app, model, [QUESTION])
    assert _metric(app, "helios_snapshots_published_total") >= 2  # stable prefix end and prompt end
    assert _metric(app, "helios_snapshots_restored_total") == 0
    answer = {"role": "assistant", "content": reply["content"] or ""}
    turn2 = [QUESTION, answer, {"role": "user", "content": "and 7 plus 8?"}]
    warm_answer = _chat(app, model, turn2)
    assert _metric(app, "helios_snapshots_restored_total") == 1
    cold, _ = _served(hybrid)
    try:
        assert _chat(create_app(cold), model, turn2) == warm_answer
    finally:
        cold.shutdown()
