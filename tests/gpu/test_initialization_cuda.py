"""INITIALIZATION programs on CUDA, eager and captured as CUDA graphs: run over exactly the admitted
slots before each step's program (tests/runtime/test_initialization.py on the CPU)."""

from __future__ import annotations

import pytest

from helios.contract import StartupOptions
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime
from runtime.test_initialization import core_path  # noqa: F401 (the module-scoped core fixture)
from runtime.test_model_fixture import EXPECTED, open_fixture
from support.initialization_core import MARK

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
def test_initialization_programs_on_cuda(core_path, cuda_graphs):  # noqa: F811
    load = LoadOptions(startup=StartupOptions(), device="cuda", cuda_graphs=cuda_graphs)
    plain = build_runtime(open_fixture(), RuntimeOptions(load=load))  # the same core without the program
    try:
        reference = [list(r.token_ids) for r in generate(plain.engine, EXPECTED["prompts"], EXPECTED["max_tokens"])]
    finally:
        plain.close()
    runtime = build_runtime(open_fixture(core_path), RuntimeOptions(load=load))
    try:
        buffers = runtime.model.buffers
        buffers["output_counts"].fill_(5)
        results = generate(runtime.engine, EXPECTED["prompts"], EXPECTED["max_tokens"])
        marks = buffers["init_marks"].tolist()
        admitted = [slot for slot, mark in enumerate(marks) if mark >= MARK]
        assert len(admitted) == len(EXPECTED["prompts"])
        for slot in admitted:
            assert int(buffers["output_counts"][slot].sum()) == EXPECTED["max_tokens"]
        assert [list(r.token_ids) for r in results] == reference
    finally:
        runtime.close()
