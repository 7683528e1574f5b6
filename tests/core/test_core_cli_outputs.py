"""Outputs of `helios relocate | sign` the operator names oddly: each is refused before any byte is
written, in one line naming the option, where the command used to write somewhere else or name a
temporary file of its own."""

from __future__ import annotations

import pytest

from helios.cli.main import main

from .builders import build_core, random_bytes


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def signed(tmp_path, capsys):
    from helios.core.keys import load_signing_key

    assert run(capsys, "keygen", "-o", tmp_path / "k.key")[0] == 0
    core = tmp_path / "m.core"
    build_core(core, [load_signing_key(tmp_path / "k.key")], extra={"blob": random_bytes(2000)})
    return core


def _sign(core, *extra):
    return ["sign", core, "--key", core.parent / "k.key", "--replace", *extra]


@pytest.mark.parametrize("command", ["relocate", "sign"])
def test_an_output_ending_in_a_slash_names_a_directory_not_a_file(signed, tmp_path, capsys, command):
    """`-o mirror/` for a directory that does not exist wrote the core as the FILE `mirror`."""
    argv = ["relocate", signed] if command == "relocate" else _sign(signed)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, _, err = run(capsys, *argv, "-o", f"{tmp_path / 'mirror'}/")
    assert code == 2 and err.count("\n") == 1 and "names a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("command", ["relocate", "sign"])
def test_an_output_whose_temporary_file_cannot_be_made_is_refused_naming_the_output(signed, tmp_path, capsys,
                                                                                     command):
    """A name that fits where `.NAME.XXXXXXXX.tmp` beside it does not: the write failed (exit 1)
    naming that temporary file, which the operator never named."""
    output = tmp_path / ("n" * 245 + ".core")
    argv = ["relocate", signed] if command == "relocate" else _sign(signed)
    code, _, err = run(capsys, *argv, "-o", output)
    assert code == 2 and err.count("\n") == 1 and f"-o {output}: cannot create a file beside it" in err
    assert ".tmp" not in err and not output.exists()


def test_keygen_to_a_path_ending_in_a_slash_writes_no_key(tmp_path, capsys):
    """`keygen -o keys/` wrote the private key as the file `keys` (and `keys.pub` beside it)."""
    code, _, err = run(capsys, "keygen", "-o", f"{tmp_path / 'keys'}/")
    assert code == 2 and err.count("\n") == 1 and "names a directory" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["encode", "example-core"])
def test_a_contract_output_whose_temporary_file_cannot_be_made_is_refused_naming_it(tmp_path, capsys, command):
    from .builders import EXAMPLE_CONTRACT

    output = tmp_path / ("n" * 245 + ".core")
    if command == "encode":
        argv = ["contract", "encode", EXAMPLE_CONTRACT, output]
    else:
        assert run(capsys, "keygen", "-o", tmp_path / "k.key")[0] == 0
        argv = ["contract", "example-core", EXAMPLE_CONTRACT.with_name("contract-tiny.json"), "-o", output,
                "--key", tmp_path / "k.key", "--namespace", "test/outputs"]
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and f"{output}: cannot create a file beside it" in err
    assert ".tmp" not in err and not output.exists()


def test_a_newline_in_a_file_name_cannot_forge_a_report_line(signed, tmp_path, capsys):
    """`verify` printed the core's path as it was: a core named ``a\\n  signed by trusted key 00.core``
    (a download's name) printed a "signed by trusted key" line of its own, as did the paths `sign`,
    `relocate` and `keygen` print."""
    from .builders import NAMESPACE

    forged = "\n  signed by trusted key 0000"
    core = tmp_path / f"a{forged}.core"
    assert run(capsys, "relocate", signed, "-o", core)[0] == 0
    code, out, _ = run(capsys, "verify", core, "--accept", NAMESPACE, "--trust", tmp_path / "k.key.pub")
    assert code == 0 and out.count("signed by trusted key") == 2 and "\\n  signed by trusted key 0000" in out
    assert [line for line in out.splitlines() if "trusted key 0000" in line][0].startswith("verified ")
    for argv in (_sign(core), ["relocate", core, "-o", core], ["keygen", "-o", tmp_path / f"k2{forged}"]):
        code, out, _ = run(capsys, *argv)
        assert code == 0 and "trusted key 0000" in out and forged not in out
