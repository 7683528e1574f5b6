"""A core without an INITIALIZATION graph whose RESUME graphs write a state view its RESTORATION
program writes too: the runtime zeroes the state a program writes for the slots a step admits, and
it does so before the step's restores, not after them (which would clear the state restored).

The core is the state-graphs core (tests/support/state_graphs_core.py), whose RESTORATION program
marks the slot row it restores in ``state_copy_marks``, with its RESUME graphs declaring a write of
that view (the programs are the same: the declaration alone makes the runtime reset it)."""

from __future__ import annotations

import pytest

from helios.contract import serving_pb2 as spb
from helios.runtime.offline import generate
from runtime.test_hybrid_runtime import PROMPTS, STEPS, expected, hybrid  # noqa: F401 (fixtures)
from runtime.test_initialized_restores import rewritten_core
from runtime.test_state_graphs import launches, state_core, state_runtime  # noqa: F401 (fixture)
from support.state_graphs_core import MARKS, RESTORE_MARK


def resume_writes_marks(source, contract, manifest, writer) -> None:
    for graph in contract.model.graphs:
        if graph.operation == spb.GRAPH_OPERATION_RESUME:
            graph.state_accesses.add(view=MARKS, mode=spb.ACCESS_MODE_WRITE)


@pytest.fixture(scope="module")
def resume_core(hybrid, state_core, tmp_path_factory):  # noqa: F811
    return rewritten_core(hybrid, state_core, tmp_path_factory.mktemp("resume_writes"), resume_writes_marks)


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
