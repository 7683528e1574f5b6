"""`helios contract example-core -o OUT` with the generator stood in for (what it writes is
`test_contract_core`'s): `-o LINK` writes the core the link names, as `sign`, `relocate` and
`contract encode` do (the core was renamed over the link itself), and the output name stays in its line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import helios.ignition.contract_core as contract_core
from helios.cli.main import main
from helios.core.keys import SigningKey, write_key_pair

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "contract-tiny.json"


@pytest.fixture
def generated_into(tmp_path, monkeypatch) -> list[Path]:
    """The paths the stand-in generator wrote, each a file holding b"core"."""
    written: list[Path] = []

    def write_contract_core(prepared, target, key, namespace, seed=0):
        temporary = Path(target).with_name(".core.tmp")  # renamed into place, as the core writer does
        temporary.write_bytes(b"core")
        os.replace(temporary, target)
        written.append(Path(target))
        return {}

    monkeypatch.setattr(contract_core, "write_contract_core", write_contract_core)
    write_key_pair(tmp_path / "k.key", SigningKey.generate())
    return written


def _example_core(tmp_path: Path, output: Path) -> int:
    return main(["contract", "example-core", str(EXAMPLE), "-o", str(output), "--key", str(tmp_path / "k.key"),
                 "--namespace", "test/example"])


def test_an_output_that_is_a_link_is_written_through(tmp_path, generated_into):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "example.core").write_bytes(b"an older core")
    link = tmp_path / "current.core"
    link.symlink_to(Path("store", "example.core"))
    assert _example_core(tmp_path, link) == 0
    assert link.is_symlink() and (tmp_path / "store" / "example.core").read_bytes() == b"core"
    assert generated_into == [(tmp_path / "store" / "example.core").resolve()]


def test_a_newline_in_the_output_name_stays_in_its_line(tmp_path, generated_into, capsys):
    output = tmp_path / "example.core\nverified: ok"
    assert _example_core(tmp_path, output) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(f"wrote {tmp_path}/example.core\\nverified: ok: ")
    assert generated_into == [output]
