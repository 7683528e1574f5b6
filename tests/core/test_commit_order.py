"""A split core written over another one: a commit that fails or is interrupted between the renames
of its files leaves the existing core whole (or the new one whole), never its core file over the
new core's parts (`helios.core.container`)."""

from __future__ import annotations

import os
import signal

import pytest

from helios.core import container
from helios.core.reader import open_core

from .builders import NAMESPACE, build_core


def _files(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _tokenizer(path, key) -> bytes:
    core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public])
    core.verify_resources()
    return core.read_resource("tok")


def test_a_core_file_rename_that_fails_puts_back_the_parts_it_replaced(tmp_path, key, monkeypatch):
    """Before: the parts were renamed over the existing core's, then the core file's rename failed:
    the old core file named the new parts (every read a ChunkDigestError), both cores lost."""
    path = tmp_path / "m.core"
    build_core(path, [key], split_nbytes=100, extra={"tok": b"A" * 300})
    before = _files(tmp_path)
    real = os.replace

    def replace(source, target):
        if os.path.basename(target) == "m.core":
            raise OSError(5, "Input/output error")
        return real(source, target)

    monkeypatch.setattr(container.os, "replace", replace)
    with pytest.raises(OSError, match="Input/output error"):
        build_core(path, [key], split_nbytes=60, extra={"tok": b"B" * 300})  # more parts than the old core
    monkeypatch.undo()
    assert _files(tmp_path) == before  # no new part left beside it, no temporary or kept file
    assert _tokenizer(path, key) == b"A" * 300


def test_a_stop_signal_between_the_renames_waits_for_the_whole_commit(tmp_path, key, monkeypatch):
    """Before: SIGTERM (as `helios relocate` turns it into an exception) raised between the renames
    of the parts and of the core file left the old core file over the new parts."""
    path = tmp_path / "m.core"
    build_core(path, [key], split_nbytes=100, extra={"tok": b"A" * 300})
    real, renames = os.replace, []

    def replace(source, target):
        renames.append(os.path.basename(target))
        if len(renames) == 1:
            signal.raise_signal(signal.SIGTERM)
        return real(source, target)

    class Stopped(BaseException):
        pass

    def stop(signum, frame):
        raise Stopped()

    monkeypatch.setattr(container.os, "replace", replace)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(Stopped):
            build_core(path, [key], split_nbytes=100, extra={"tok": b"B" * 300})
    finally:
        signal.signal(signal.SIGTERM, previous)
    monkeypatch.undo()
    assert renames[-1] == "m.core" and len(renames) > 2
    assert not [name for name in _files(tmp_path) if name.startswith(".")]
    assert _tokenizer(path, key) == b"B" * 300
