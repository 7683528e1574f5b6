"""Programs loaded on CUDA are built straight from their graph JSON (`graph_image`), hold nothing on
the CPU, and generate the fixture core's recorded tokens with and without CUDA graphs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import helios.runtime.loading.programs as programs
from helios.core.reader import open_core
from helios.runtime.loading.cuda_graphs import CapturedProgram
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime

pytestmark = pytest.mark.gpu
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXPECTED = json.loads((FIXTURES / "models" / "tiny_qwen3.json").read_text())


def _open():
    return open_core(FIXTURES / "models" / "tiny_qwen3.core", accept=EXPECTED["namespace"],
                     trusted_keys=[FIXTURES / "cores" / "TEST-ONLY-signing.key.pub"])


@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs", "eager"])
def test_programs_on_cuda_are_built_directly_and_hold_nothing_on_the_cpu(monkeypatch, cuda_graphs):
    built = []
    build = programs.build_module
    def counted(*arguments):
        module = build(*arguments)  # raises NotDirect for what torch's path builds
        built.append(module)
        return module
    monkeypatch.setattr(programs, "build_module", counted)
    runtime = build_runtime(_open(), RuntimeOptions(load=LoadOptions(device="cuda", cuda_graphs=cuda_graphs)))
    try:
        model = runtime.model
        assert len(built) == len(model.programs)  # every serving program (the tuning producer: torch's path)
        for program in model.programs:
            module = program.module.eager_modules[0] if isinstance(program.module, CapturedProgram) else program.module
            tensors = [*module.parameters(), *module.buffers(),
                       *(v for m in module.modules() for v in vars(m).values() if isinstance(v, torch.Tensor))]
            assert all(t.device.type == "cuda" for t in tensors)
            for node in module.graph.nodes:
                device = node.kwargs.get("device")
                assert device is None or torch.device(device).type == "cuda", node.format_node()
        results = generate(runtime.engine, EXPECTED["prompts"], EXPECTED["max_tokens"])
        assert [list(r.token_ids) for r in results] == EXPECTED["token_ids"]
    finally:
        runtime.close()
