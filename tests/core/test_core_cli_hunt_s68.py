"""Hostile inputs to `helios keygen | sign | verify | inspect` found in session 68: each was a
traceback, a forged report line or a file left behind, and is one typed line now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helios.cli.main import main
from helios.core.errors import KeyFileError
from helios.core.keys import SigningKey, write_key_pair

from .builders import NAMESPACE, new_writer

# A PKCS#8 private key on secp112r1, a curve `cryptography` cannot load (UnsupportedAlgorithm).
UNSUPPORTED_CURVE_PEM = b"""-----BEGIN PRIVATE KEY-----
ME4CAQAwEAYHKoZIzj0CAQYFK4EEAAYENzA1AgEBBA6POIek0mbrIRBlbnkBoaEg
Ax4ABJjUikJa8Zddi1NjX90TI9+IzQaPI+CCWbrQUbo=
-----END PRIVATE KEY-----
"""


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_private_key_of_an_unsupported_curve_is_a_key_file_error(small_core, tmp_path, capsys):
    """`load_pem_private_key` raises UnsupportedAlgorithm (neither ValueError nor TypeError) for
    such a key: `sign --key` ended in a traceback."""
    with pytest.raises(KeyFileError, match="not an Ed25519 key"):
        SigningKey.from_pem(UNSUPPORTED_CURVE_PEM)
    key = tmp_path / "ec.pem"
    key.write_bytes(UNSUPPORTED_CURVE_PEM)
    code, _, err = run(capsys, "sign", small_core, "--key", key, "-o", tmp_path / "signed.core")
    assert code == 2 and err.count("\n") == 1 and f"--key {key}" in err and "Traceback" not in err
    assert not (tmp_path / "signed.core").exists()


@pytest.mark.parametrize("dangling", ["k.key", "k.key.pub"])
def test_keygen_next_to_a_dangling_link_writes_nothing(tmp_path, capsys, dangling):
    """A dangling link does not `exist()`, but the exclusive create fails on it: keygen wrote the
    private key, then failed on KEY.pub with exit 1, leaving a private key without its public key."""
    (tmp_path / dangling).symlink_to(tmp_path / "nowhere")
    code, _, err = run(capsys, "keygen", "-o", tmp_path / "k.key")
    assert code == 2 and err.count("\n") == 1 and "refusing to overwrite a key" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [dangling]
    assert not (tmp_path / "nowhere").exists()


def test_a_key_pair_write_that_fails_leaves_neither_file(tmp_path, monkeypatch):
    """A failure writing KEY.pub (a full disk) removes the private key written just before."""
    import os

    real_open = os.open

    def full_disk(path, flags, mode=0o777, **kwargs):
        if str(path).endswith(".pub"):
            raise OSError(28, "No space left on device", str(path))
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_key_pair(tmp_path / "k.key", SigningKey.generate())
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_inspect_keeps_each_core_string_in_its_own_line(tmp_path, capsys):
    """A resource id (or graph name, file name) holding a newline printed a line of its own under
    `inspect`, which could pass for a resource or a signature line the report writes."""
    forged = "  key " + "ab" * 16 + ": valid"
    writer = new_writer([SigningKey.generate()], extra={f"tok\n{forged}": b"abc"})
    writer.write(tmp_path / "m.core")
    code, out, _ = run(capsys, "inspect", tmp_path / "m.core")
    assert code == 0
    assert forged not in out.splitlines()
    assert f"  tok\\n{forged}  TOKENIZER  rank all" in out
    report = json.loads(run(capsys, "inspect", tmp_path / "m.core", "--json")[1])
    assert f"tok\n{forged}" in {r["id"] for r in report["resources"]}
    assert report["publisher"]["namespace"] == NAMESPACE


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_a_file_that_is_not_a_core_is_named(small_core, tmp_path, capsys, command):
    """'not a Helios core (magic bytes missing)' did not say which file; an empty file said the
    same as a key or a contract given by mistake."""
    pub = tmp_path / "k.pub"
    pub.write_text(SigningKey.generate().public.to_line())
    trust = ["--accept", NAMESPACE, "--trust", pub] if command == "verify" else []
    empty, truncated = tmp_path / "empty.core", tmp_path / "truncated.core"
    empty.write_bytes(b"")
    truncated.write_bytes(small_core.read_bytes()[:600])
    for path, problem in ((pub, "not a Helios core"), (empty, "is empty, not a Helios core"),
                          (truncated, "end exactly at the end of file")):
        code, _, err = run(capsys, command, path, *trust)
        assert code == 4 and err.count("\n") == 1
        assert err.startswith(f"helios {command}: error: {path}") and problem in err


def test_relocate_never_splits_over_the_parts_of_the_core_it_reads(tmp_path, capsys):
    """`sign -o signed.core` beside a split m.core writes a core that reads m.core's parts;
    `relocate signed.core -o m.core --split-bytes N` then renamed new m.core.partNNN over them
    and signed.core no longer verified (exit 5)."""
    from .builders import build_core, random_bytes

    key = SigningKey.generate()
    write_key_pair(tmp_path / "k.key", key)
    build_core(tmp_path / "m.core", [SigningKey.generate()], extra={"blob": random_bytes(3000)}, split_nbytes=1000)
    assert run(capsys, "sign", tmp_path / "m.core", "--key", tmp_path / "k.key", "-o", tmp_path / "signed.core")[0] == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    code, _, err = run(capsys, "relocate", tmp_path / "signed.core", "-o", tmp_path / "m.core", "--split-bytes", 500)
    assert code == 2 and err.count("\n") == 1 and "m.core.part000 would replace a file of the core" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    verify = ["--accept", NAMESPACE, "--trust", tmp_path / "k.key.pub"]
    assert run(capsys, "verify", tmp_path / "signed.core", *verify)[0] == 0
    # In place, and to a name of its own, the split goes ahead.
    assert run(capsys, "relocate", tmp_path / "signed.core", "-o", tmp_path / "signed.core", "--split-bytes", 500)[0] == 0
    assert run(capsys, "verify", tmp_path / "signed.core", *verify)[0] == 0
    assert run(capsys, "relocate", tmp_path / "m.core", "-o", tmp_path / "n.core", "--split-bytes", 500)[0] == 0


def test_sign_in_place_through_a_link_signs_the_core_it_names(small_core, tmp_path, capsys):
    """The signed core was renamed over the link itself: the link became a copy and the core it
    named stayed unsigned (`contract encode` writes through a link)."""
    from helios.core.reader import load_unverified

    write_key_pair(tmp_path / "co.key", co := SigningKey.generate())
    link = tmp_path / "links" / "current.core"
    link.parent.mkdir()
    link.symlink_to(small_core)
    assert run(capsys, "sign", link, "--key", tmp_path / "co.key")[0] == 0
    assert link.is_symlink() and link.resolve() == small_core.resolve()
    assert co.key_id in {signer.key_id for signer in load_unverified(small_core).signers}


def test_a_core_signed_or_relocated_in_place_keeps_its_mode(small_core, tmp_path, capsys):
    """The core written in place took the umask's mode (0644), whatever the file it replaced had."""
    core = tmp_path / "own.core"
    core.write_bytes(small_core.read_bytes())
    core.chmod(0o640)
    write_key_pair(tmp_path / "co.key", SigningKey.generate())
    assert run(capsys, "sign", core, "--key", tmp_path / "co.key")[0] == 0
    assert core.stat().st_mode & 0o777 == 0o640
    assert run(capsys, "relocate", core, "-o", core)[0] == 0
    assert core.stat().st_mode & 0o777 == 0o640


def test_a_split_core_reached_through_a_link_finds_its_parts_beside_the_file(tmp_path, capsys):
    """Parts were looked up beside the link, not beside the core file they were written with."""
    from .builders import build_core, random_bytes

    key = SigningKey.generate()
    write_key_pair(tmp_path / "k.key", key)
    store = tmp_path / "store"
    store.mkdir()
    build_core(store / "m.core", [key], extra={"blob": random_bytes(3000)}, split_nbytes=1000)
    link = tmp_path / "current.core"
    link.symlink_to(Path("store", "m.core"))
    code, _, err = run(capsys, "verify", link, "--accept", NAMESPACE, "--trust", tmp_path / "k.key.pub")
    assert code == 0, err
    assert "location problem" not in run(capsys, "inspect", link)[1]
    assert run(capsys, "relocate", link, "-o", tmp_path / "copy.core")[0] == 0


def test_a_split_core_of_links_into_a_blob_store_finds_its_parts_beside_the_links(tmp_path, capsys):
    """A model cache's snapshot links each file (the core and each part, by their names) into its
    blobs: the parts lie beside the links, not beside the blob the core's link names."""
    from .builders import build_core, random_bytes

    key = SigningKey.generate()
    write_key_pair(tmp_path / "k.key", key)
    built, blobs, snapshot = tmp_path / "built", tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    for folder in (built, blobs, snapshot):
        folder.mkdir(parents=True)
    build_core(built / "m.core", [key], extra={"blob": random_bytes(3000)}, split_nbytes=1000)
    for index, file in enumerate(sorted(built.iterdir())):
        file.rename(blobs / f"sha{index:04d}")
        (snapshot / file.name).symlink_to(blobs / f"sha{index:04d}")
    core = snapshot / "m.core"
    code, _, err = run(capsys, "verify", core, "--accept", NAMESPACE, "--trust", tmp_path / "k.key.pub")
    assert code == 0, err
    assert "location problem" not in run(capsys, "inspect", core)[1]
