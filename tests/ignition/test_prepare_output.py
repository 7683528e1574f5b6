"""Preparation writes the weights while the programs are captured (`CoreWriter.begin`): a capture
that fails leaves no file behind in the output folder, and a finished core opens and verifies."""

from __future__ import annotations

import pytest

import helios.ignition.export as export
from helios.core.keys import SigningKey
from helios.core.reader import open_core
from helios.ignition.export import CapacityPlan, PrepareOptions, prepare_core
from ignition.hf_checkpoints import QWEN3
from support.chat_checkpoint import write_chat_checkpoint

NAMESPACE = "test.helios/prepare-output"
PLAN = CapacityPlan(context_tokens=64, prefill_tokens=16, decode_batches=(1,), mixed=False, token_logprobs=False)


class _CaptureFailed(RuntimeError):
    pass


def test_a_failed_capture_leaves_no_files_and_a_finished_core_verifies(tmp_path, monkeypatch):
    checkpoint = write_chat_checkpoint(QWEN3, tmp_path / "checkpoint", seed=3)
    key = SigningKey.generate()
    output = tmp_path / "out"
    output.mkdir()

    def failing(*args, **kwargs):
        raise _CaptureFailed("capture failed")

    with monkeypatch.context() as patched:
        patched.setattr(export, "capture_all", failing)
        with pytest.raises(_CaptureFailed):
            prepare_core(checkpoint, output / "model.core", key, PrepareOptions(NAMESPACE, capacities=PLAN))
    assert list(output.iterdir()) == []
    prepare_core(checkpoint, output / "model.core", key, PrepareOptions(NAMESPACE, capacities=PLAN))
    assert [p.name for p in output.iterdir()] == ["model.core"]
    core = open_core(output / "model.core", accept=NAMESPACE, trusted_keys=[key.public])
    assert core.verify_resources() > 0
    ids = [r.id for r in core.resources]
    assert ids.index("weights.rank0") < ids.index("program.decode.r1t1.rank0")  # stored first, during capture


def test_a_full_disk_while_the_weights_are_written_ends_the_capture_naming_the_output(tmp_path, monkeypatch, capsys):
    """The weights are written on a thread while the programs are captured: a full disk there was
    reported only after every program had been captured (minutes, for a large model). Now the
    capture stops after the program it is on; the line names the output and no file is left."""
    import errno
    import threading
    from concurrent import futures

    from helios.cli.main import main
    from helios.core.container import ContainerWriter
    from helios.core.keys import write_key_pair
    from helios.ignition import capture_pool

    checkpoint = write_chat_checkpoint(QWEN3, tmp_path / "checkpoint", seed=3)
    write_key_pair(tmp_path / "k.key", SigningKey.generate())
    output = tmp_path / "out"
    output.mkdir()
    disk_full = threading.Event()
    captured = []
    real_capture = capture_pool.capture_program

    def full_disk(self):
        disk_full.set()
        raise OSError(errno.ENOSPC, "No space left on device")

    watched = []
    real_capture_all = export.capture_all

    def capture_all(*args, **kwargs):
        watched.append(kwargs.get("watched"))
        return real_capture_all(*args, **kwargs)

    def capture(*args, **kwargs):
        assert disk_full.wait(60)  # the weights' write has failed while this program is captured
        if watched[0] is not None:
            futures.wait([watched[0]], timeout=60)  # and its error has reached the future
        captured.append(args[1])
        return real_capture(*args, **kwargs)

    monkeypatch.setattr(ContainerWriter, "sync_data", full_disk)  # the background store's last step
    monkeypatch.setattr(export, "capture_all", capture_all)
    monkeypatch.setattr(capture_pool, "capture_program", capture)
    code = main(["prepare", str(checkpoint), "-o", str(output / "model.core"), "--key", str(tmp_path / "k.key"),
                 "--namespace", NAMESPACE, "--context-tokens", "64", "--prefill-tokens", "16",
                 "--decode-batches", "1", "--no-mixed", "--no-logprobs"])
    err = capsys.readouterr().err
    assert code == 1 and "No space left on device" in err and str(output / "model.core") in err
    assert len(captured) == 1  # of three programs
    assert list(output.iterdir()) == []
