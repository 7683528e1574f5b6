"""`helios prepare`'s own lines and where it writes, with the preparation itself stood in for (what
it writes is `test_prepare_output`'s): every path goes into its line escaped (a newline in the output
name forged a line of its own), and `-o LINK` writes the core the link names, as `sign`, `relocate`
and `contract encode` do (the finished core was renamed over the link itself)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import helios.cli.prepare_cmd as prepare_cmd
from helios.cli.main import main
from helios.core.keys import SigningKey, write_key_pair


@pytest.fixture
def prepared_into(tmp_path, monkeypatch) -> list[Path]:
    """The paths the stand-in preparation wrote, each a file holding b"core"."""
    written: list[Path] = []

    def prepare_core(checkpoint, output, key, options, progress):
        progress(f"writing {output}")
        temporary = Path(output).with_name(".core.tmp")  # renamed into place, as the core writer does
        temporary.write_bytes(b"core")
        os.replace(temporary, output)
        written.append(Path(output))
        return SimpleNamespace(files=[Path(output)], resources=[])

    monkeypatch.setattr(prepare_cmd, "prepare_core", prepare_core)
    (tmp_path / "checkpoint").mkdir()
    write_key_pair(tmp_path / "k.key", SigningKey.generate())
    return written


def _prepare(tmp_path: Path, output: Path) -> int:
    return main(["prepare", str(tmp_path / "checkpoint"), "-o", str(output), "--key", str(tmp_path / "k.key"),
                 "--namespace", "test/lines"])


def test_a_newline_in_the_output_name_stays_in_its_line(tmp_path, prepared_into, capsys):
    output = tmp_path / "model.core\nverified: ok"
    assert _prepare(tmp_path, output) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and out.startswith(f"wrote {tmp_path}/model.core\\nverified: ok: 0 resources")
    assert err == f"  writing {tmp_path}/model.core\\nverified: ok\n"
    assert prepared_into == [output]


def test_an_output_that_is_a_link_is_written_through(tmp_path, prepared_into, capsys):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "model.core").write_bytes(b"an older core")
    link = tmp_path / "current.core"
    link.symlink_to(Path("store", "model.core"))
    assert _prepare(tmp_path, link) == 0
    assert link.is_symlink() and (tmp_path / "store" / "model.core").read_bytes() == b"core"
    assert prepared_into == [(tmp_path / "store" / "model.core").resolve()]


@pytest.fixture
def planned(tmp_path, monkeypatch) -> list:
    """The capacity plans the stand-in preparation was given."""
    plans = []

    def prepare_core(checkpoint, output, key, options, progress):
        plans.append(options.capacities)
        return SimpleNamespace(files=[Path(output)], resources=[])

    monkeypatch.setattr(prepare_cmd, "prepare_core", prepare_core)
    (tmp_path / "checkpoint").mkdir()
    write_key_pair(tmp_path / "k.key", SigningKey.generate())
    return plans


@pytest.mark.parametrize(("given", "prefill"), [([], 256), (["--context-tokens", "100"], 100),
                                                (["--context-tokens", "4096"], 256),
                                                (["--context-tokens", "100", "--prefill-tokens", "64"], 64)])
def test_the_default_prefill_fits_a_smaller_context(tmp_path, planned, capsys, given, prefill):
    """`--context-tokens 100` alone failed: "prefill_tokens 256 exceeds context_tokens (100)", of a
    default the operator never set. Now the default prefill step is at most the context."""
    assert main(["prepare", str(tmp_path / "checkpoint"), "-o", str(tmp_path / "m.core"), "--key",
                 str(tmp_path / "k.key"), "--namespace", "test/lines", *given]) == 0
    assert [plan.prefill_tokens for plan in planned] == [prefill]


def test_a_prefill_given_beyond_the_context_is_still_refused(tmp_path, planned, capsys):
    assert main(["prepare", str(tmp_path / "checkpoint"), "-o", str(tmp_path / "m.core"), "--key",
                 str(tmp_path / "k.key"), "--namespace", "test/lines", "--context-tokens", "100",
                 "--prefill-tokens", "128"]) != 0
    assert "--prefill-tokens must be in 1..100 (--context-tokens)" in capsys.readouterr().err and planned == []
