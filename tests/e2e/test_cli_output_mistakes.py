"""Output paths and stops at the `helios` command line that `test_cli_inputs` did not reach: an
output that is a FIFO or a device (replaced by the renamed core, /dev/null itself when run as root,
or waited on), the public key beside `--key`, `keygen -o .`, a contract write that fails part way,
a closed standard input, SIGTERM while a core is written, and an API key no request can send. Each
is one line on stderr and a documented exit status, and leaves no file behind."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from core.builders import NAMESPACE, build_core, random_bytes
from helios.cli.main import main
from helios.core.keys import SigningKey, load_signing_key, write_key_pair
from support.cli_runs import disk_full_past, one_line, run_cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "contract-tiny.json"


def run(capsys, *argv) -> tuple[int, str]:
    code, _, err = run_cli(capsys, *argv)
    return code, err


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli-outputs")
    write_key_pair(root / "pub.key", SigningKey.generate())
    write_key_pair(root / "other.key", SigningKey.generate())
    build_core(root / "m.core", [load_signing_key(root / "pub.key")], extra={"blob": random_bytes(3000)})
    (root / "checkpoint").mkdir()
    return {"root": root, "core": root / "m.core", "other": root / "other.key", "checkpoint": root / "checkpoint"}


def _writers(files, output: Path) -> dict[str, list]:
    key = files["other"]
    return {
        "sign": ["sign", files["core"], "--key", key, "-o", output],
        "relocate": ["relocate", files["core"], "-o", output],
        "contract encode": ["contract", "encode", EXAMPLE, output],
        "contract example-core": ["contract", "example-core", EXAMPLE, "-o", output, "--key", key,
                                  "--namespace", "a/b"],
        "prepare": ["prepare", files["checkpoint"], "-o", output, "--key", key, "--namespace", "a/b"],
    }


@pytest.mark.parametrize("command", ["sign", "relocate", "contract example-core", "prepare"])
def test_an_output_that_is_a_fifo_is_refused_and_left_as_it_was(files, tmp_path, command, capsys):
    """`helios relocate m.core -o /dev/null`, run as root, renamed the written core over /dev/null
    (a regular file from then on, for every process on the machine); a FIFO was replaced the same
    way. A FIFO stands in for the device here. (`contract encode` writes one stream: through, below.)"""
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that a write into it cannot wait
    try:
        code, err = run(capsys, *_writers(files, fifo)[command])
    finally:
        os.close(reader)
    assert code == 2 and f"{fifo} is not a regular file" in one_line(err)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("command", ["sign", "contract example-core"])
def test_an_output_that_is_the_public_key_of_the_signing_key_is_refused(files, tmp_path, command, capsys):
    """`prepare` refused `-o KEY.pub`; `sign` and `contract example-core` replaced the public key with a core."""
    key = tmp_path / "signer.key"
    write_key_pair(key, SigningKey.generate())
    public = Path(f"{key}.pub")
    before = public.read_bytes()
    argv = _writers({**files, "other": key}, public)[command]
    code, err = run(capsys, *argv)
    assert code == 2 and "is the public key of --key" in one_line(err)
    assert public.read_bytes() == before


@pytest.mark.parametrize("output", ["", "."])
def test_keygen_into_the_current_directory_is_a_usage_error(tmp_path, output, capsys, monkeypatch):
    """`helios keygen -o ""` (an unset variable) raised ValueError from pathlib: a traceback."""
    monkeypatch.chdir(tmp_path)
    code, err = run(capsys, "keygen", "-o", output)
    assert code == 2 and "is a directory" in one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_contract_encode_that_runs_out_of_room_leaves_the_previous_output(tmp_path, capsys):
    """The bundle was written in place: a full disk (RLIMIT_FSIZE here) left the first kilobyte of it
    where the operator's previous file was, and said so as a usage error (exit 2)."""
    output = tmp_path / "contract.bin"
    output.write_bytes(b"the operator's previous file")
    with disk_full_past(1024):
        code = main(["contract", "encode", str(EXAMPLE), str(output)])
    err = capsys.readouterr().err
    assert code == 1 and one_line(err) == f"helios contract: error: File too large: {output}\n"
    assert output.read_bytes() == b"the operator's previous file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["contract.bin"]
    assert main(["contract", "encode", str(EXAMPLE), str(output)]) == 0  # and without the limit, in place
    assert main(["contract", "check", str(output)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["contract.bin"]


def test_contract_check_of_a_closed_standard_input(capsys, monkeypatch):
    """`helios contract check - <&-`: Python sets sys.stdin to None; reading it raised AttributeError."""
    monkeypatch.setattr(sys, "stdin", None)
    code, err = run(capsys, "contract", "check", "-")
    assert code == 2 and "standard input is closed" in one_line(err)


_TERMINATED_WHILE_WRITING = """
import os, signal, sys
import helios.core.container as container
finish = container._PendingFile.finish
def terminated(self):
    os.kill(os.getpid(), signal.SIGTERM)  # as `kill PID` would, while the temporary core is written
    finish(self)
container._PendingFile.finish = terminated
from helios.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["relocate", "sign"])
def test_sigterm_while_a_core_is_written_leaves_no_temporary_file(files, tmp_path, command):
    """SIGTERM's default action ended `relocate` and `sign` at once, leaving `.OUT.XXXX.tmp` (as large
    as the core) beside the output; `prepare` already unwound it."""
    output = tmp_path / "out.core"
    argv = [str(a) for a in _writers(files, output)[command]]
    done = subprocess.run([sys.executable, "-c", _TERMINATED_WHILE_WRITING, *argv], capture_output=True, text=True,
                          timeout=240)
    assert (done.returncode, done.stderr) == (128 + signal.SIGTERM, f"helios {command}: terminated\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("api_key", [" secret", "secret "])
def test_serve_refuses_an_api_key_with_whitespace_at_its_ends(api_key, capsys):
    """The guard drops the spaces after "Bearer" and HTTP parsers strip a header's ends: with such a
    key every /v1/ request got 401."""
    code, err = run(capsys, "serve", "no.core", "--accept", NAMESPACE, "--api-key", api_key)
    assert code == 2 and "--api-key" in one_line(err) and "whitespace" in err


def test_contract_encode_writes_through_a_stream_and_a_link_and_keeps_the_mode(tmp_path, capsys):
    """`contract encode FILE /dev/stdout` (or a FIFO, or process substitution) writes the bundle
    through; a regular output is replaced atomically, through a link to it, with its mode kept."""
    expected = tmp_path / "expected.bin"
    assert main(["contract", "encode", str(EXAMPLE), str(expected)]) == 0
    fifo = tmp_path / "stream"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    code, err = run(capsys, "contract", "encode", EXAMPLE, fifo)
    reader.join(30)
    assert code == 0 and received == [expected.read_bytes()] and f"wrote {fifo}" in err
    target, link = tmp_path / "target.bin", tmp_path / "link.bin"
    target.write_bytes(b"old")
    target.chmod(0o640)
    link.symlink_to(target)
    assert run(capsys, "contract", "encode", EXAMPLE, link)[0] == 0
    assert link.is_symlink() and target.read_bytes() == expected.read_bytes()
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


@pytest.mark.parametrize("command", ["sign", "relocate", "contract encode", "contract example-core", "prepare"])
def test_an_output_that_is_a_symbolic_link_loop_is_a_usage_error(files, tmp_path, command, capsys):
    """`-o loop.core` where loop.core is a link to itself: following the link to the file it names
    raised pathlib's RuntimeError ("Symlink loop"), a traceback, in every command that writes a core."""
    loop = tmp_path / "loop.core"
    loop.symlink_to(loop.name)
    code, err = run(capsys, *_writers(files, loop)[command])
    assert code == 2 and f"{loop} is a symbolic link that cannot be followed" in one_line(err)
    assert loop.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["loop.core"]


def test_prepare_through_a_link_to_a_checkpoint_file_is_refused(files, tmp_path, capsys):
    """`-o model.core`, a link to the checkpoint's weights: the name's suffix was checked, not the
    file the core is written to, and the finished core replaced the weights it was prepared from."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"the weights")
    link = tmp_path / "model.core"
    link.symlink_to(checkpoint / "model.safetensors")
    code, err = run(capsys, "prepare", checkpoint, "-o", link, "--key", files["other"], "--namespace", "a/b")
    assert code == 2 and f"-o {link} would replace a file of the checkpoint" in one_line(err)
    assert (checkpoint / "model.safetensors").read_bytes() == b"the weights"


def test_prepare_onto_a_checkpoint_link_is_refused_where_it_leads(files, tmp_path, capsys):
    """`-o checkpoint/model.safetensors`, a link inside the checkpoint to `store/model.safetensors`
    (a layout prepare follows): the output resolves out of the checkpoint's directory, so the check
    by name passed and the core replaced the weights (the review's find). The same file is refused."""
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "store").mkdir(parents=True)
    (checkpoint / "store" / "model.safetensors").write_bytes(b"the weights")
    (checkpoint / "model.safetensors").symlink_to("store/model.safetensors")
    output = checkpoint / "model.safetensors"
    code, err = run(capsys, "prepare", checkpoint, "-o", output, "--key", files["other"], "--namespace", "a/b")
    assert code == 2 and "would replace a file of the checkpoint" in one_line(err)
    assert (checkpoint / "store" / "model.safetensors").read_bytes() == b"the weights"
