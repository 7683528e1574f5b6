"""A core without an INITIALIZATION graph whose RESUME graphs write a state view its RESTORATION
program writes too: the runtime zeroes the state a program writes for the slots a step admits, and
it does so before the step's restores, not after them (which would clear the state restored).

The core is the state-graphs core (tests/support/state_graphs_core.py), whose RESTORATION program
marks the slot row it restores in ``state_copy_marks``, with its RESUME graphs declaring a write of
that view (the programs are the same: the declaration alone makes the runtime reset it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.core.keys import load_signing_key
from helios.core.reader import open_core
from helios.core.writer import CoreWriter
from helios.runtime.offline import generate
from runtime.test_hybrid_runtime import NAMESPACE, PROMPTS, STEPS, expected, hybrid  # noqa: F401 (fixtures)
from runtime.test_state_graphs import launches, state_core, state_runtime  # noqa: F401 (fixture)
from support.state_graphs_core import MARKS, RESTORE_MARK


def write_resume_writes_marks(source, key_path: Path, namespace: str, target: Path) -> Path:
    contract_bytes, manifest_bytes = source.prepared.encode()
    contract = spb.ServingContract.FromString(contract_bytes)
    manifest = mpb.ExecutionManifest.FromString(manifest_bytes)
    for graph in contract.model.graphs:
        if graph.operation == spb.GRAPH_OPERATION_RESUME:
            graph.state_accesses.add(view=MARKS, mode=spb.ACCESS_MODE_WRITE)
    writer = CoreWriter()
    for info in source.resources:
        writer.add_resource(info.id, info.kind, source.read_resource(info.id), rank=info.rank)
    writer.set_contract(PreparedContract.from_messages(contract, manifest))
    writer.set_publisher(namespace)
    writer.add_signing_key(load_signing_key(key_path))
    writer.write(target)
    return target


@pytest.fixture(scope="module")
def resume_core(hybrid, state_core, tmp_path_factory):  # noqa: F811
    root, _ = hybrid
    source = open_core(state_core, accept=NAMESPACE, trusted_keys=[root / "publisher.key.pub"])
    target = tmp_path_factory.mktemp("resume_writes") / "resume_writes.core"
    return write_resume_writes_marks(source, root / "publisher.key", NAMESPACE, target)


def test_an_admitted_slots_state_is_reset_before_its_restore(hybrid, expected, resume_core):  # noqa: F811
    runtime = state_runtime(hybrid, resume_core)
    try:
        model = runtime.model
        assert not model.initialization_programs
        marks = model.buffers[MARKS]
        cold = generate(runtime.engine, [PROMPTS[0]], STEPS)[0]
        assert list(cold.token_ids) == expected[0]
        marks[: model.num_slot_state_rows].fill_(7)  # what an earlier owner might have left: the reset clears it
        warm = generate(runtime.engine, [PROMPTS[1]], STEPS)[0]
        assert launches(runtime)["restoration"] == 1 and launches(runtime)["resume"] >= 1
        assert list(warm.token_ids) == expected[1]
        slot_marks = marks.tolist()[: model.num_slot_state_rows]
        restored = [row for row, mark in enumerate(slot_marks) if mark >= RESTORE_MARK]
        assert len(restored) == 1  # the restored slot's row kept the restore's mark (it was not reset after)
    finally:
        runtime.close()
