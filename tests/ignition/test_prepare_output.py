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
