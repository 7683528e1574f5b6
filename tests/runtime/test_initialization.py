"""INITIALIZATION graphs are served: the executor runs the program over the rows a step admits, before
the step's program, and the runtime leaves the slot's state to it."""

from __future__ import annotations

import pytest

from helios.runtime.offline import generate
from helios.runtime.service import build_runtime
from runtime.test_model_fixture import EXPECTED, KEY, NAMESPACE, open_fixture
from support.initialization_core import MARK, write_initialization_core


@pytest.fixture(scope="module")
def core_path(tmp_path_factory):
    return write_initialization_core(open_fixture(), KEY, NAMESPACE, tmp_path_factory.mktemp("init") / "init.core")


def test_the_initialization_program_initializes_exactly_the_admitted_slots(core_path):
    runtime = build_runtime(open_fixture(core_path))
    assert len(runtime.model.initialization_programs) == 1
    prompts, steps = EXPECTED["prompts"], EXPECTED["max_tokens"]
    buffers = runtime.model.buffers
    buffers["output_counts"].fill_(5)  # what earlier requests might have left: only the program clears it
    before = buffers["init_marks"].tolist()
    for _ in range(2):  # the second round admits slots again (new generations)
        results = generate(runtime.engine, prompts, steps)
        assert [list(r.token_ids) for r in results] == EXPECTED["token_ids"]
        marks = buffers["init_marks"].tolist()
        admitted = [slot for slot, (mark, old) in enumerate(zip(marks, before)) if mark != old]
        assert len(admitted) == len(prompts) and all(marks[slot] > max(MARK, before[slot]) - 1 for slot in admitted)
        for slot in admitted:  # cleared by the program, then one count per sampled token
            assert int(buffers["output_counts"][slot].sum()) == steps
        before = marks
    never = [slot for slot, mark in enumerate(before) if mark == 0]
    for slot in never:  # no program ran over it and the runtime did not clear it either
        assert buffers["output_counts"][slot].eq(5).all()
