"""`helios keygen | sign | verify | inspect | relocate`: exit codes by error class, one-line
errors, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helios.cli.main import main
from helios.core.reader import load_unverified

from .builders import NAMESPACE, build_core, random_bytes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cores"
COMMANDS = ["keygen", "sign", "verify", "inspect", "relocate"]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def published(tmp_path, capsys):
    """A key pair made by `helios keygen` and a core signed with it."""
    from helios.core.keys import load_signing_key

    assert run(capsys, "keygen", "-o", tmp_path / "pub.key")[0] == 0
    core = tmp_path / "m.core"
    build_core(core, [load_signing_key(tmp_path / "pub.key")], extra={"blob": random_bytes(2000)})
    return core, tmp_path / "pub.key.pub"


@pytest.mark.parametrize("command", COMMANDS)
def test_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert command in capsys.readouterr().out


def test_keygen_writes_a_pair_and_never_overwrites(tmp_path, capsys):
    code, out, _ = run(capsys, "keygen", "-o", tmp_path / "k", "--namespace", "acme/x")
    assert code == 0 and "key id" in out
    assert (tmp_path / "k.pub").read_text().strip().endswith("acme/x")
    code, _, err = run(capsys, "keygen", "-o", tmp_path / "k")
    assert code == 2 and err.count("\n") == 1 and "refusing" in err


def test_verify_exit_codes(published, tmp_path, capsys, monkeypatch):
    core, pub = published
    assert run(capsys, "verify", core, "--accept", NAMESPACE, "--trust", pub)[0] == 0
    assert run(capsys, "verify", core, "--accept", NAMESPACE, "--trust", tmp_path)[0] == 0
    assert run(capsys, "verify", core, "--accept", "someone/else", "--trust", pub)[0] == 7
    other = tmp_path / "other"
    other.mkdir()
    run(capsys, "keygen", "-o", other / "o.key")
    assert run(capsys, "verify", core, "--accept", NAMESPACE, "--trust", other / "o.key.pub")[0] == 6
    monkeypatch.delenv("HELIOS_TRUST", raising=False)
    assert run(capsys, "verify", core, "--accept", NAMESPACE)[0] == 2
    monkeypatch.setenv("HELIOS_TRUST", str(pub))
    assert run(capsys, "verify", core, "--accept", NAMESPACE)[0] == 0
    (tmp_path / "junk.core").write_bytes(b"not a core at all")
    code, _, err = run(capsys, "verify", tmp_path / "junk.core", "--accept", NAMESPACE)
    assert code == 4 and err.count("\n") == 1
    data = bytearray(core.read_bytes())
    data[load_unverified(core).placements["blob"].offset + 5] ^= 1
    core.write_bytes(data)
    code, _, err = run(capsys, "verify", core, "--accept", NAMESPACE)
    assert code == 5 and "chunk" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as usage:
        main(["verify", str(core)])  # --accept is required
    assert usage.value.code == 2


def test_inspect_is_marked_unverified(published, capsys):
    core, _ = published
    code, out, _ = run(capsys, "inspect", core)
    assert code == 0
    assert out.startswith("UNVERIFIED")
    assert f"publisher namespace: {NAMESPACE}" in out
    assert "blob  TOKENIZER  rank all  stored" in out and "contract check: ok" in out
    code, out, _ = run(capsys, "inspect", core, "--json")
    report = json.loads(out)
    assert report["is_verified"] is False and report["core_format"] == "PAYLOAD_V2"
    assert {r["id"] for r in report["resources"]} >= {"blob"}


def test_inspect_escapes_what_a_terminal_would_act_on(tmp_path, capsys):
    """A core's strings are unverified under inspect: escape sequences and bidirectional overrides
    in them are printed as escapes, newlines kept."""
    from helios.core.keys import SigningKey

    from .builders import new_writer

    writer = new_writer([SigningKey.generate()])
    writer.set_publisher(NAMESPACE, license="line one\nline two\x1b]0;owned\x07", acceptance_terms="ok\u202eevil")
    writer.write(tmp_path / "m.core")
    code, out, _ = run(capsys, "inspect", tmp_path / "m.core")
    assert code == 0 and "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "license: line one\n  | line two\\x1b]0;owned\\x07" in out and "acceptance terms: ok\\u202eevil" in out
    report = json.loads(run(capsys, "inspect", tmp_path / "m.core", "--json")[1])
    assert report["publisher"]["license"] == "line one\nline two\x1b]0;owned\x07"


def test_inspect_marks_each_line_of_a_license_after_its_first(tmp_path, capsys):
    """A license's lines could pass for inspect's own (a signature reported "valid"): each line
    after its first is marked."""
    from helios.core.keys import SigningKey

    from .builders import new_writer

    writer = new_writer([SigningKey.generate()])
    forged = "MIT\nsignatures:\n  key 00ff: valid\rtrailer"
    writer.set_publisher(NAMESPACE, license=forged, acceptance_terms="a\r\nb")
    writer.write(tmp_path / "m.core")
    code, out, _ = run(capsys, "inspect", tmp_path / "m.core")
    assert code == 0
    assert "license: MIT\n  | signatures:\n  |   key 00ff: valid\n  | trailer\n" in out
    assert "acceptance terms: a\n  | b\n" in out
    assert all(not line.startswith("  key 00ff") for line in out.splitlines())


def test_relocate_and_sign(published, tmp_path, capsys):
    core, pub = published
    assert run(capsys, "relocate", core, "-o", tmp_path / "s.core", "--split-bytes", 1)[0] == 0
    assert (tmp_path / "s.core.part000").exists()
    assert run(capsys, "verify", tmp_path / "s.core", "--accept", NAMESPACE, "--trust", pub)[0] == 0
    assert run(capsys, "relocate", core, "-o", tmp_path / "x.core", "--split-bytes", 0)[0] == 2
    run(capsys, "keygen", "-o", tmp_path / "co.key")
    assert run(capsys, "sign", tmp_path / "s.core", "--key", tmp_path / "co.key")[0] == 0
    co_pub = tmp_path / "co.key.pub"
    assert run(capsys, "verify", tmp_path / "s.core", "--accept", NAMESPACE, "--trust", co_pub)[0] == 0
    code, _, err = run(capsys, "sign", tmp_path / "s.core", "--key", tmp_path / "co.key")
    assert code == 2 and "already signed this core (--replace re-signs it)" in err  # a usage error (was 6)
    before = (tmp_path / "s.core").read_bytes()
    assert run(capsys, "sign", tmp_path / "s.core", "--key", tmp_path / "co.key", "--replace")[0] == 0
    assert (tmp_path / "s.core").read_bytes() != before


def test_real_process_on_the_fixtures(capsys):
    # One fixture through a real process (each one imports torch: seconds); the others through main().
    for name in ("payload_v2.core", "logical_v6.core", "logical_v4.core"):
        argv = ["verify", str(FIXTURES / name), "--accept", "test.helios/fixtures",
                "--trust", str(FIXTURES / "TEST-ONLY-signing.key.pub"),
                "--aes-key", str(FIXTURES / "TEST-ONLY-aes.key")]
        if name == "logical_v4.core":
            done = subprocess.run([sys.executable, "-m", "helios.cli.main", *argv],
                                  capture_output=True, text=True, check=False)
            code, out, err = done.returncode, done.stdout, done.stderr
        else:
            code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert "verified" in out
    # Without the AES key: one line and exit status 4 from main() (the process above exits with main()'s status).
    code, _, err = run(capsys, "verify", FIXTURES / "logical_v4.core", "--accept", "test.helios/fixtures",
                       "--trust", FIXTURES)
    assert code == 4 and "Traceback" not in err
    assert err.count("\n") == 1 and "needs the operator's AES key" in err
    assert err.rstrip().endswith("give it with --aes-key FILE")


def test_ctrl_c_while_the_commands_are_imported_is_one_line(monkeypatch, capsys):
    """Importing the command modules (torch among them) takes seconds; a Ctrl-C then was a
    KeyboardInterrupt traceback and an exit by the signal."""
    import helios.cli.main as cli_main

    def interrupted(argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "build_parser", interrupted)
    assert cli_main.main(["serve"]) == 130
    assert capsys.readouterr().err == "helios: interrupted\n"
