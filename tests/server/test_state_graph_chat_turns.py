"""Chat turns on a hybrid core that declares SNAPSHOT, RESTORATION and RESUME graphs
(tests/support/state_graphs_core.py), through the HTTP app: the first turn's stable-prefix and
prompt-boundary snapshots are written by the SNAPSHOT program, the second turn restores through the
RESTORATION program and continues in a RESUME step (all visible in /metrics), and answers exactly as
a cold server of the plain core does."""

from __future__ import annotations

import asyncio
import re

import pytest

from helios.core.reader import open_core
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from server.test_hybrid_chat_turns import NAMESPACE, QUESTION, _call, _chat, _metric, _served, hybrid  # noqa: F401
from support.state_graphs_core import write_state_graphs_core


@pytest.fixture(scope="module")
def state_root(hybrid):  # noqa: F811
    source = open_core(hybrid / "model.core", accept=NAMESPACE, trusted_keys=[hybrid / "publisher.key.pub"])
    write_state_graphs_core(source, hybrid / "publisher.key", NAMESPACE, hybrid / "state.core")
    return hybrid


def _launches(app, operation: str) -> float:
    text = asyncio.run(_call(app, "GET", "/metrics")).text
    found = re.search(rf'^helios_graph_launches_total{{operation="{operation}"}} ([0-9.e+]+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_chat_turns_snapshot_and_restore_through_the_cores_programs(state_root):
    core = open_core(state_root / "state.core", accept=NAMESPACE, trusted_keys=[state_root / "publisher.key.pub"])
    runtime = build_runtime(core, RuntimeOptions())
    served = ServedModel.from_runtime(runtime, queue_capacity=8, frontend_workers=1, owned_by=NAMESPACE)
    served.start()
    try:
        app, model = create_app(served), runtime.model.prepared.contract.served_id
        reply, _ = _chat(app, model, [QUESTION])
        assert _metric(app, "helios_snapshots_published_total") >= 2  # stable prefix end and prompt end
        assert _launches(app, "snapshot") >= 2 and _launches(app, "restoration") == 0
        answer = {"role": "assistant", "content": reply["content"] or ""}
        turn2 = [QUESTION, answer, {"role": "user", "content": "and 7 plus 8?"}]
        warm_answer = _chat(app, model, turn2)
        assert _metric(app, "helios_snapshots_restored_total") == 1
        assert _launches(app, "restoration") == 1 and _launches(app, "resume") >= 1
    finally:
        served.shutdown()
    cold, _ = _served(state_root)  # the plain core, cold
    try:
        assert _chat(create_app(cold), model, turn2) == warm_answer
    finally:
        cold.shutdown()
