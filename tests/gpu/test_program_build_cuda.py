"""Programs loaded on CUDA are built straight from their graph JSON (`graph_image`), hold nothing on
the CPU, and generate the fixture core's recorded tokens with and without CUDA graphs; a CUDA load
and its first requests never import torch._dynamo (`helios.abi.op_library`)."""

from __future__ import annotations

import json
import subprocess
import sys
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
        assert len(built) == len(model.programs) + 1  # every serving program and the tuning producer
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


_NO_DYNAMO = """
import json, sys
from pathlib import Path
from helios.core.reader import open_core
from helios.runtime.loading.model import LoadOptions
from helios.runtime.offline import generate
from helios.runtime.service import RuntimeOptions, build_runtime
fixtures = Path(sys.argv[1])
expected = json.loads((fixtures / "models" / "tiny_qwen3.json").read_text())
core = open_core(fixtures / "models" / "tiny_qwen3.core", accept=expected["namespace"],
                 trusted_keys=[fixtures / "cores" / "TEST-ONLY-signing.key.pub"])
runtime = build_runtime(core, RuntimeOptions(load=LoadOptions(device="cuda", cuda_graphs=True)))
results = generate(runtime.engine, expected["prompts"], expected["max_tokens"])
runtime.close()
print(json.dumps({"tokens_match": [list(r.token_ids) for r in results] == expected["token_ids"],
                  "dynamo": "torch._dynamo" in sys.modules}))
"""


def test_a_cuda_load_and_its_requests_never_import_dynamo():
    """torch._dynamo (4-6.6 s to import on the device's host) is not imported by a CUDA load with
    graphs (programs built from JSON, ABI ops without custom_op's dynamo-disable wrapper, Triton
    precompile, capture) nor by serving requests; a fresh process, so nothing else imported it."""
    done = subprocess.run([sys.executable, "-c", _NO_DYNAMO, str(FIXTURES)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"tokens_match": True, "dynamo": False}
