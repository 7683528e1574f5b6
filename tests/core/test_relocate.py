"""Relocation, splitting, joining and co-signing keep the signed payload byte for byte and read
identically."""

from __future__ import annotations

import shutil

import pytest

from helios.core.errors import BadSignatureError, ChunkDigestError, UntrustedSignerError
from helios.core.reader import load_unverified, open_core
from helios.core.records import CoreFormat
from helios.core.relocate import add_signatures, relocate_core

from .builders import AES_KEY, NAMESPACE, build_core, random_bytes, read_body

BLOBS = {"blob.a": random_bytes(5000, 1), "blob.b": b"text " * 3000, "blob.c": b""}


def contents(path, key):
    core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public], aes_key=AES_KEY)
    return {info.id: core.read_resource(info.id) for info in core.resources}


def payload_of(path) -> bytes:
    return read_body(path)[1].envelope.payload


@pytest.mark.parametrize("core_format", list(CoreFormat), ids=lambda f: f.name)
def test_split_join_and_move_read_identically(tmp_path, key, core_format):
    original = tmp_path / "a" / "m.core"
    original.parent.mkdir()
    build_core(original, [key], core_format=core_format, extra=BLOBS)
    expected = contents(original, key)

    (tmp_path / "b").mkdir()
    split = relocate_core(original, tmp_path / "b" / "split.core", split_nbytes=4000)
    assert len(split) > 2
    assert all(load_unverified(split[0]).placements[rid].file for rid in expected)
    moved = tmp_path / "c"
    shutil.copytree(tmp_path / "b", moved)  # a mirror copies the directory as is
    joined = relocate_core(moved / "split.core", tmp_path / "joined.core")
    assert joined == (tmp_path / "joined.core",)
    for path in (split[0], moved / "split.core", joined[0]):
        assert contents(path, key) == expected
        assert payload_of(path) == payload_of(original)
        assert read_body(path)[1].envelope == read_body(original)[1].envelope


def test_relocate_in_place_and_refuse_corrupt_sources(tmp_path, key):
    path = tmp_path / "m.core"
    build_core(path, [key], extra=BLOBS)
    expected = contents(path, key)
    relocate_core(path, path, split_nbytes=1)
    assert contents(path, key) == expected
    relocate_core(path, path)
    assert contents(path, key) == expected
    data = bytearray(path.read_bytes())
    placement = load_unverified(path).placements["blob.a"]
    data[placement.offset + 10] ^= 1
    path.write_bytes(data)
    with pytest.raises(ChunkDigestError):
        relocate_core(path, tmp_path / "out.core")
    assert not (tmp_path / "out.core").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_co_sign_and_replace(tmp_path, key, other_key):
    path = tmp_path / "m.core"
    build_core(path, [key], extra=BLOBS)
    add_signatures(path, path, [other_key])
    core = open_core(path, accept=NAMESPACE, trusted_keys=[other_key.public])
    assert core.read_resource("blob.a") == BLOBS["blob.a"]
    assert len(read_body(path)[1].envelope.signatures) == 2
    with pytest.raises(BadSignatureError):
        add_signatures(path, path, [other_key])
    add_signatures(path, tmp_path / "only.core", [other_key], replace=True)
    assert len(read_body(tmp_path / "only.core")[1].envelope.signatures) == 1
    with pytest.raises(UntrustedSignerError):
        open_core(tmp_path / "only.core", accept=NAMESPACE, trusted_keys=[key.public])


def test_signing_a_split_core_rewrites_only_the_core_file(tmp_path, key, other_key):
    path = tmp_path / "m.core"
    files = build_core(path, [key], extra=BLOBS, split_nbytes=1).files
    parts = {f: f.stat().st_mtime_ns for f in files[1:]}
    written = add_signatures(path, path, [other_key])
    assert {f: f.stat().st_mtime_ns for f in files[1:]} == parts
    assert set(written[1:]) == set(parts)
    assert contents(path, key) == contents(path, other_key)


def test_signing_refuses_a_corrupt_core(tmp_path, key, other_key):
    path = tmp_path / "m.core"
    build_core(path, [key], extra=BLOBS)
    data = bytearray(path.read_bytes())
    data[load_unverified(path).placements["blob.b"].offset + 3] ^= 1
    path.write_bytes(data)
    with pytest.raises(ChunkDigestError):
        add_signatures(path, tmp_path / "signed.core", [other_key])


def test_relocate_and_sign_write_through_unpredictable_temporary_names(tmp_path, key, other_key):
    """Files planted where a predictable temporary name would be (a plain file, a symlink to a
    victim) neither fail the write nor are written through; the results get the usual file mode."""
    import os

    path = tmp_path / "m.core"
    build_core(path, [key], extra=BLOBS)
    expected = contents(path, key)
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    for name in ("out.core", "signed.core"):
        (tmp_path / f".{name}.tmp-{os.getpid()}").write_bytes(b"planted")
        (tmp_path / f".{name}.tmp").symlink_to(victim)
    relocate_core(path, tmp_path / "out.core", split_nbytes=4000)
    add_signatures(path, tmp_path / "signed.core", [other_key])
    assert contents(tmp_path / "out.core", key) == expected
    assert contents(tmp_path / "signed.core", key) == expected
    assert victim.read_bytes() == b"untouched"
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "out.core").stat().st_mode & 0o777 == 0o666 & ~umask
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert leftovers == sorted(f".{n}.tmp{s}" for n in ("out.core", "signed.core") for s in ("", f"-{os.getpid()}"))


def _parts_beside(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f"{path.name}.part"))


def test_a_core_written_over_a_split_one_removes_the_parts_it_no_longer_names(tmp_path, key):
    """A split into fewer parts (or a join into one file) over an earlier split left the earlier
    OUT.partNNN files beside the new core, named by nothing: gigabytes of stale parts a mirror copied."""
    path = tmp_path / "m.core"
    build_core(path, [key], extra=BLOBS)
    expected = contents(path, key)
    many = relocate_core(path, path, split_nbytes=1)
    assert len(many) > 4
    (tmp_path / "m.core.part999").write_bytes(b"not named by any core")  # not the core's: left alone
    fewer = relocate_core(path, path, split_nbytes=6000)
    assert 2 < len(fewer) < len(many)
    assert _parts_beside(path) == sorted([p.name for p in fewer[1:]] + ["m.core.part999"])
    assert contents(path, key) == expected
    relocate_core(path, path)  # joined: no part of it is left
    assert _parts_beside(path) == ["m.core.part999"]
    assert contents(path, key) == expected
    other = tmp_path / "o.core"
    relocate_core(path, other, split_nbytes=1)
    relocate_core(path, other)  # over another core's name: its parts go too
    assert _parts_beside(other) == []
    assert contents(other, key) == expected


def test_a_core_written_over_a_split_one_keeps_the_parts_its_source_reads(tmp_path, key, other_key):
    """`add_signatures` beside a split core writes a core that reads the split core's parts; joining
    that one over the split core's name leaves the parts it still reads."""
    path = tmp_path / "m.core"
    build_core(path, [key], extra=BLOBS, split_nbytes=4000)
    parts = _parts_beside(path)
    signed = tmp_path / "signed.core"
    add_signatures(path, signed, [other_key])
    assert _parts_beside(signed) == [] and _parts_beside(path) == parts
    relocate_core(signed, path)
    assert _parts_beside(path) == parts
    assert contents(signed, key) == contents(path, key)


def test_a_part_name_taken_by_a_directory_fails_before_any_file_is_replaced(tmp_path, key):
    """The parts were renamed into place one by one at the end, and the rename onto a directory
    failed after the parts before it had replaced an earlier core's: that core no longer read, and
    the error named a temporary file."""
    import os

    path = tmp_path / "m.core"
    build_core(path, [key], extra=BLOBS)
    expected = contents(path, key)
    out = tmp_path / "out.core"
    relocate_core(path, out, split_nbytes=1)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    (tmp_path / "out.core.part001").unlink()  # an earlier core's part replaced by a directory
    (tmp_path / "out.core.part001").mkdir()
    del before["out.core.part001"]
    with pytest.raises(FileExistsError) as raised:
        relocate_core(path, out, split_nbytes=1)
    assert raised.value.filename == str(tmp_path / "out.core.part001")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    os.mkfifo(tmp_path / "n.core.part000")
    with pytest.raises(FileExistsError):
        relocate_core(path, tmp_path / "n.core", split_nbytes=1)
    assert not (tmp_path / "n.core").exists() and contents(path, key) == expected
