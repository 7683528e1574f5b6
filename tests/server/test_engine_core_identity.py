"""The engine process serves the core the serving process verified (`helios.server.engine_process`).

The engine process opens the core file by path again, after (or, for an order sent ahead, beside) the
serving process's own open: a file replaced between the two (a redeploy writing a new core under the
same name) was loaded and served while the frontend read the contract, tokenizer and template of the
core verified first. The serving process now sends the signed body's digest it verified; the engine
process refuses another core before loading it, and the ready record of an order sent ahead (made
before the serving process opened the core) carries the digest the serving process compares.
"""

from __future__ import annotations

import shutil

import pytest

from helios.cli import serve_run
from helios.core.reader import open_core
from helios.runtime.service import RuntimeOptions
from helios.server import engine_process
from helios.server.engine_process import CoreReplacedError, CoreSource, start_engine_process
from helios.server.engine_spawn import EngineSpawn
from support.server_core import serve_args, tiny_core


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


def test_the_serving_process_sends_the_digest_of_the_core_it_verified(core, tmp_path):
    path = tmp_path / "model.core"
    shutil.copyfile(core.path, path)
    args = serve_args(str(path), "--accept", core.namespace, "--trust", str(core.public_key))
    opened, source = serve_run._open(args)
    assert source.body_sha256 == opened.body_sha256 and len(source.body_sha256) == 32


def test_the_engine_process_refuses_a_core_other_than_the_one_verified_before_loading_it(core, monkeypatch):
    def no_load(*args):
        raise AssertionError("the replaced core was loaded")

    monkeypatch.setattr("helios.runtime.service.build_runtime", no_load)
    verified = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]).body_sha256
    replaced = bytes(byte ^ 0xFF for byte in verified)  # the file now holds another core
    source = CoreSource(str(core.path), core.namespace, (str(core.public_key),), body_sha256=replaced)
    with pytest.raises(CoreReplacedError, match="changed after the serving process verified it") as raised:
        engine_process._load(source, RuntimeOptions(), None)
    assert raised.value.exit_code == 4
    assert engine_process._portable(raised.value) is raised.value  # it crosses the pipe with its type


class _Process:
    def __init__(self):
        self.exitcode = None

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        self.exitcode = -9

    def join(self, timeout=None) -> None:
        pass


class _ReadyPipe:
    """The serving process's end of an engine process that loaded the core at `body_sha256` and is ready."""

    def __init__(self, body_sha256: bytes):
        self._ready = engine_process._Ready(b"{}", "", (), body_sha256)
        self.closed = False

    def send(self, message) -> None:
        pass

    def poll(self, timeout) -> bool:
        return True

    def recv(self):
        return self._ready

    def close(self) -> None:
        self.closed = True


def test_an_order_sent_ahead_that_loaded_another_core_is_stopped_and_refused(core):
    """The order sent ahead is made from the command line before the serving process opens the core:
    the engine process may have loaded the file as it was before a redeploy replaced it."""
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    source = CoreSource(str(core.path), core.namespace, (str(core.public_key),), body_sha256=opened.body_sha256)
    process, pipe = _Process(), _ReadyPipe(bytes(32))
    spawned = EngineSpawn(process, pipe)
    spawned.ordered_ahead = True
    with pytest.raises(CoreReplacedError, match=f"verified {opened.body_sha256.hex()[:16]}"):
        start_engine_process(source, opened.prepared, RuntimeOptions(), spawned=spawned)
    assert not process.is_alive() and pipe.closed
