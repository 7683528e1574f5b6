"""Loading a core unpickles nothing: the fixture core loads and generates its recorded tokens with
every unpickler patched to raise; a core with pickled (torch.export.save) programs, and signed cores
whose program resources were crafted to hold a pickle or code, are refused with typed errors."""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from helios.abi.program_graph import ForbiddenProgramError
from helios.abi.program_image import PickledProgramError, UnreadableProgramError
from helios.contract import core_pb2
from helios.core.keys import load_signing_key
from helios.core.reader import open_core
from helios.core.records import ResourceKind
from helios.core.writer import CoreWriter
from helios.errors import LoadError
from helios.runtime.offline import generate
from helios.runtime.service import build_runtime
from support.no_unpickling import no_unpickling

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORE = FIXTURES / "models" / "tiny_qwen3.core"
PICKLED = FIXTURES / "models" / "tiny_qwen3_pickled.core"
EXPECTED = json.loads((FIXTURES / "models" / "tiny_qwen3.json").read_text())
KEY = FIXTURES / "cores" / "TEST-ONLY-signing.key"
NAMESPACE = EXPECTED["namespace"]


def _open(path: Path):
    return open_core(path, accept=NAMESPACE, trusted_keys=[Path(str(KEY) + ".pub")])


def test_loading_and_generating_unpickle_nothing():
    with no_unpickling():
        runtime = build_runtime(_open(CORE))
        results = generate(runtime.engine, EXPECTED["prompts"], EXPECTED["max_tokens"])
    assert [list(r.token_ids) for r in results] == EXPECTED["token_ids"]
    kinds = {info.kind for info in _open(CORE).resources if info.id.startswith("program.")}
    assert kinds == {ResourceKind.PROGRAM_IMAGE}


def test_a_core_with_pickled_programs_is_refused_by_its_signed_kind():
    core = _open(PICKLED)  # still a valid, verifiable core
    assert {info.kind for info in core.resources if info.id.startswith("program.")} == {ResourceKind.PROGRAM}
    with no_unpickling(), pytest.raises(PickledProgramError, match="prepare the core again") as raised:
        build_runtime(core)
    assert isinstance(raised.value, LoadError) and raised.value.exit_code == 8


def _resign(tmp_path: Path, replace) -> Path:
    """The fixture core with each program resource's bytes replaced by `replace(bytes)`, signed
    again with the fixture key (what a trusted but hostile publisher could ship)."""
    source = _open(CORE)
    writer = CoreWriter()
    for info in source.resources:
        data = source.read_resource(info.id)
        if info.kind is ResourceKind.PROGRAM_IMAGE:
            data = replace(data)
        writer.add_resource(info.id, info.kind, data, rank=info.rank)
    writer.set_contract(source.prepared)
    writer.set_publisher(NAMESPACE)
    writer.add_signing_key(load_signing_key(KEY))
    target = tmp_path / "crafted.core"
    writer.write(target)
    return target


class _Payload:
    """Unpickling this runs code (sets an environment variable)."""

    def __reduce__(self):
        return exec, ("import os; os.environ['HELIOS_TEST_UNPICKLED'] = '1'",)


def _with_expression(data: bytes) -> bytes:
    message = core_pb2.ProgramImage.FromString(data)
    graph = json.loads(message.exported_program)
    values = graph["graph_module"]["graph"]["tensor_values"]
    first = values[next(iter(values))]
    first["sizes"][0] = {"as_expr": {"expr_str": "__import__('os').environ.__setitem__('HELIOS_TEST_UNPICKLED', '1')",
                                     "hint": None}}
    message.exported_program = json.dumps(graph).encode()
    return message.SerializeToString()


def _with_pickled_constants(data: bytes) -> bytes:
    message = core_pb2.ProgramImage.FromString(data)
    message.constants = pickle.dumps(_Payload())
    return message.SerializeToString()


def _torch_save_archive(data: bytes) -> bytes:
    buffer = io.BytesIO()
    torch.save({"payload": _Payload()}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("replace, error", [
    (lambda data: pickle.dumps(_Payload()), UnreadableProgramError),
    (_torch_save_archive, PickledProgramError),
    (_with_pickled_constants, UnreadableProgramError),
    (_with_expression, ForbiddenProgramError),
], ids=["pickle", "torch-save-archive", "pickled-constants", "code-in-expression"])
def test_crafted_program_resources_in_a_signed_core_are_refused(tmp_path, monkeypatch, replace, error):
    monkeypatch.delenv("HELIOS_TEST_UNPICKLED", raising=False)
    core = _open(_resign(tmp_path, replace))  # signature and commitments are fine
    with no_unpickling(), pytest.raises(error):
        build_runtime(core)
    assert "HELIOS_TEST_UNPICKLED" not in os.environ


def test_the_command_line_names_the_problem_and_the_fix(capsys):
    from helios.cli.main import main  # (main()'s status is the process's: tests/core/test_cli.py runs one)

    code = main(["generate", str(PICKLED), "--accept", NAMESPACE, "--trust", str(KEY) + ".pub",
                 "--prompt-ids", "[[3, 4]]", "--max-tokens", "1"])
    stderr = capsys.readouterr().err
    assert code == 8, stderr
    assert "torch.export.save" in stderr and "helios prepare" in stderr
    assert "Traceback" not in stderr


def test_verify_accepts_an_older_core_and_says_serving_will_refuse_it(capsys):
    from helios.cli.main import main

    trust = str(KEY) + ".pub"
    assert main(["verify", str(PICKLED), "--accept", NAMESPACE, "--trust", trust]) == 0
    assert "serving refuses this core; prepare it again" in capsys.readouterr().out
    assert main(["verify", str(CORE), "--accept", NAMESPACE, "--trust", trust]) == 0
    assert "torch.export.save" not in capsys.readouterr().out
