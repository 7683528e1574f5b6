"""`helios serve`'s start around its engine process's order (`helios.cli.serve_order`): the order sent
ahead carries the load's flags only, both processes agree on whether a core file is served, the start's
mistakes are reported in the order they were before the order went ahead, and no progress line or trace
mark fails a start whose stderr nobody reads."""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import sys
import types

import pytest

from helios.cli import serve_cmd, serve_order, serve_run
from helios.cli.main import main
from helios.errors import UsageError
from helios.server.engine_spawn import ArgsOrder
from helios.server.start_trace import ENV, mark
from support.server_core import serve_args, tiny_core


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


class _Spawn:
    """An engine process that never starts: it keeps what it was ordered ahead."""

    def __init__(self):
        self.ahead = None

    def order_ahead(self, message):
        self.ahead = message

    def discard(self):
        pass


def test_the_order_sent_ahead_carries_the_load_flags_and_no_api_key(core, monkeypatch):
    spawn = _Spawn()
    monkeypatch.setattr(serve_cmd, "spawn_engine_process", lambda **kwargs: spawn)
    monkeypatch.setattr(serve_run, "run", lambda *args: 0)
    assert main(["serve", str(core.path), "--accept", core.namespace, "--port", "0", "--api-key", "s3cr3t-bearer"]) == 0
    assert isinstance(spawn.ahead, ArgsOrder) and spawn.ahead.make is serve_order.engine_order
    flags = spawn.ahead.args
    assert flags.core == str(core.path) and flags.accept == core.namespace and flags.port == 0
    assert not hasattr(flags, "api_key") and not hasattr(flags, "func")
    assert b"s3cr3t-bearer" not in pickle.dumps(spawn.ahead)


@pytest.mark.parametrize("given", [None, ""])
def test_no_core_file_is_no_order_ahead_and_both_processes_serve_the_embedded_model(core, monkeypatch, given):
    """`helios serve ""` ordered the engine process to load core file "" (refused) while the serving
    process took the empty name for the embedded model."""
    args = serve_args(*([given] if given is not None else []), "--port", "0")
    assert not serve_order.serves_core_file(args)
    spawn = _Spawn()
    monkeypatch.setattr(serve_cmd, "spawn_engine_process", lambda **kwargs: spawn)
    monkeypatch.setattr(serve_run, "run", lambda *args: 0)
    assert main(["serve", *([given] if given is not None else []), "--port", "0"]) == 0
    assert spawn.ahead is None
    monkeypatch.setattr("helios.embedded.prepared.embedded_core",
                        lambda: types.SimpleNamespace(path=core.path, namespace=core.namespace,
                                                      public_key=core.public_key))
    opened, source = serve_run._open(args)
    assert source.path == str(core.path) and opened.path == core.path


def test_a_start_without_trusted_keys_says_so_before_the_aes_key_is_read(core, monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("HELIOS_TRUST", raising=False)
    bad = tmp_path / "bad.aes"
    bad.write_text("not hex\n")
    assert main(["serve", str(core.path), "--accept", core.namespace, "--aes-key", str(bad), "--port", "0",
                 "--no-engine-process"]) == 2
    assert "no trusted keys" in capsys.readouterr().err


@pytest.fixture
def unread_stderr():
    """A stderr whose reader is gone: writing it raises BrokenPipeError."""
    previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "w")
    yield stream
    try:
        stream.close()
    except OSError:
        pass
    signal.signal(signal.SIGPIPE, previous)


def test_a_progress_line_no_one_reads_never_fails_the_start(unread_stderr, monkeypatch):
    monkeypatch.setattr(sys, "stderr", unread_stderr)
    serve_run._progress(argparse.Namespace(log_level="info"), "loading model.core on cuda")


def test_a_trace_mark_no_one_reads_never_raises(unread_stderr, monkeypatch):
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setattr(sys, "__stderr__", unread_stderr)
    mark("serve: engine process taken over")


def test_trusted_keys_without_a_core_file_are_refused_before_the_embedded_model_opens(core, monkeypatch, tmp_path):
    """`helios serve --trust KEY.pub` without a core file served the embedded model, verified with its
    own key, the keys given silently ignored (the operator believing the model checked against them)."""
    key = tmp_path / "key.pub"
    key.write_text("not read: refused before any key is\n")

    def no_open():
        raise AssertionError("opened the embedded model for a refused command line")

    monkeypatch.setattr("helios.embedded.prepared.embedded_core", no_open)
    with pytest.raises(UsageError, match="--trust names the keys a core file is verified with"):
        serve_run._open(serve_args("--trust", str(key), "--port", "0"))
