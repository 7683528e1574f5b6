"""The no-argument `helios serve`: the embedded default model's core, prepared into the cache once."""

from __future__ import annotations

import pytest

import helios.embedded
import helios.ignition.export
from helios.cli.main import main
from helios.core.reader import open_core
from helios.server import embedded
from ignition.hf_checkpoints import QWEN3
from support.chat_checkpoint import write_chat_checkpoint


def test_serve_without_a_model_fails_clearly_when_the_embedded_model_is_not_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(helios.embedded, "default_model_dir", lambda: tmp_path / "not-built")
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path / "cache"))
    assert main(["serve"]) == embedded.EmbeddedModelMissing.exit_code
    assert "embedded default model is not built" in capsys.readouterr().err


def test_embedded_core_is_prepared_into_the_cache_once(tmp_path, monkeypatch):
    checkpoint = write_chat_checkpoint(QWEN3, tmp_path / "default_model", seed=5)
    monkeypatch.setattr(helios.embedded, "default_model_dir", lambda: checkpoint)
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "DECODE_BATCHES", (1,))
    first = embedded.embedded_core(progress=lambda line: None)
    assert first.path.is_relative_to(tmp_path / "cache")
    core = open_core(first.path, accept=first.namespace, trusted_keys=[first.public_key])
    assert core.prepared.contract.served_id == embedded.SERVED_ID

    def no_second_preparation(*args, **kwargs):
        raise AssertionError("the cached core was prepared again")

    monkeypatch.setattr(helios.ignition.export, "prepare_core", no_second_preparation)
    assert embedded.embedded_core(progress=lambda line: None) == first
    original = (checkpoint / "config.json").read_text()
    (checkpoint / "config.json").write_text(original + "\n")
    with pytest.raises(AssertionError, match="prepared again"):  # a changed checkpoint is a new core
        embedded.embedded_core(progress=lambda line: None)
    (checkpoint / "config.json").write_text(original)
    assert embedded.embedded_core(progress=lambda line: None) == first
    monkeypatch.setattr(embedded, "PREPARATION_VERSION", embedded.PREPARATION_VERSION + 1)
    with pytest.raises(AssertionError, match="prepared again"):  # so is a newer preparation
        embedded.embedded_core(progress=lambda line: None)
