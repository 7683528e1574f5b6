"""Hostile placements and indexes found by probing: a part file that is a directory of exactly the
part's length, a read error under a placed range, and a v4 index that reuses a nonce prefix. Each
is one typed error, never an OSError or a core that opens."""

from __future__ import annotations

import os
import stat

import pytest

from helios.cli.main import main
from helios.contract import core_pb2
from helios.core import locations
from helios.core.chunks import RangeFile
from helios.core.envelope import seal
from helios.core.errors import LocationError, MalformedCoreError
from helios.core.inspection import inspect_core
from helios.core.reader import load_unverified, open_core
from helios.core.records import CoreFormat
from helios.core.relocate import relocate_core
from helios.core.writer import CoreWriter

from .builders import (
    AES_KEY, NAMESPACE, build_core, craft_core, example_contract, filler, raw_frame_of_stored_size, read_body,
    required_resources, write_body,
)


def test_a_part_replaced_by_a_directory_of_its_length_is_a_location_error(tmp_path, key, capsys, monkeypatch):
    probe = tmp_path / "probe"
    probe.mkdir()
    directory_nbytes = os.stat(probe).st_size  # 4096 on ext4; a file system's empty directory size
    part_nbytes = max(directory_nbytes, 64)  # no frame is shorter than 9 bytes
    if part_nbytes != directory_nbytes:  # (btrfs: 0) the directory is reported at the part's length
        real_stat = os.stat
        monkeypatch.setattr(locations.os, "stat", lambda path, *a, **k: _sized(real_stat(path, *a, **k), part_nbytes))
    frame, decoded = raw_frame_of_stored_size(part_nbytes)
    single = craft_core(tmp_path / "one.core", [key], {"hostile": (frame, len(decoded))})
    path = tmp_path / "split.core"
    relocate_core(single, path, split_nbytes=1)
    part = tmp_path / load_unverified(path).placements["hostile"].file
    part.unlink()
    part.mkdir()
    with pytest.raises(LocationError, match="not a regular file"):
        open_core(path, accept=NAMESPACE, trusted_keys=[key.public])
    assert "not a regular file" in inspect_core(path).location_problem
    public = tmp_path / "key.pub"
    public.write_text(key.public.to_line())
    code = main(["verify", str(path), "--accept", NAMESPACE, "--trust", str(public)])
    _out, err = capsys.readouterr()
    assert code == LocationError.exit_code and "Traceback" not in err and err.count("\n") == 1


def _sized(status: os.stat_result, nbytes: int) -> os.stat_result:
    """`status` with `nbytes` as a directory's size (a file's as it is)."""
    if not stat.S_ISDIR(status.st_mode):
        return status
    fields = list(status)
    fields[stat.ST_SIZE] = nbytes
    return os.stat_result(fields)


def test_a_read_error_under_a_placed_range_is_a_location_error(tmp_path):
    source = RangeFile(os.open(tmp_path, os.O_RDONLY), 0, 16, str(tmp_path))
    try:
        with pytest.raises(LocationError, match="cannot read"):
            source.read_at(0, 16)
    finally:
        source.close()


def test_a_v4_index_that_reuses_a_nonce_prefix_is_refused(tmp_path, key):
    path = tmp_path / "v4.core"
    build_core(path, [key], core_format=CoreFormat.LOGICAL_V4, extra={"blob.a": bytes(3000), "blob.b": bytes(3000)})
    _, body = read_body(path)
    index = core_pb2.ModelIndex.FromString(body.envelope.payload)
    by_id = {resource.id: resource for resource in index.index.resources}
    by_id["blob.a"].nonce_prefix = by_id["blob.b"].nonce_prefix
    body.envelope.CopyFrom(seal(body.format_version, index.SerializeToString(deterministic=True), [key]))
    write_body(path, body)
    with pytest.raises(MalformedCoreError, match="nonce prefixes are not unique"):
        open_core(path, accept=NAMESPACE, trusted_keys=[key.public], aes_key=AES_KEY)
    with pytest.raises(MalformedCoreError, match="nonce prefixes are not unique"):
        inspect_core(path)


def test_the_writer_refuses_to_reuse_a_nonce_prefix(tmp_path, key):
    writer = CoreWriter(CoreFormat.LOGICAL_V4, aes_key=AES_KEY, nonce_prefix_for=lambda _id: bytes(8))
    writer.set_contract(*example_contract())
    writer.set_publisher(NAMESPACE)
    for resource_id, kind, rank in required_resources():
        writer.add_resource(resource_id, kind, filler(resource_id), rank=rank)
    writer.add_signing_key(key)
    with pytest.raises(ValueError, match="same prefix"):
        writer.write(tmp_path / "reused.core")
    assert list(tmp_path.iterdir()) == []
