"""The no-argument `helios serve`: the embedded default model's core, prepared into the cache once."""

from __future__ import annotations

import pytest

import helios.embedded
import helios.ignition.export
from helios.cli.main import main
from helios.core.reader import open_core
from helios.embedded import prepared as embedded
from support.embedded_cache import embedded_copy


def test_serve_without_a_model_fails_clearly_when_the_embedded_model_is_not_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(helios.embedded, "default_model_dir", lambda: tmp_path / "not-built")
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path / "cache"))
    assert main(["serve"]) == embedded.EmbeddedModelMissing.exit_code
    assert "embedded default model is not built" in capsys.readouterr().err


def test_embedded_core_is_prepared_into_the_cache_once(tmp_path, tmp_path_factory, monkeypatch):
    # a copy of the cache into which support.embedded_cache prepared the checkpoint, by embedded_core, once a run
    checkpoint = embedded_copy(tmp_path_factory.getbasetemp(), tmp_path, monkeypatch)
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
    monkeypatch.setattr(embedded, "CORE_GENERATION", embedded.CORE_GENERATION + "-next")
    with pytest.raises(AssertionError, match="prepared again"):  # so is a newer core generation
        embedded.embedded_core(progress=lambda line: None)


def test_a_core_cached_before_programs_were_images_is_not_reused(tmp_path, monkeypatch):
    """Cores cached under the checkpoint digest alone hold pickled programs, which the runtime
    refuses; the cache key carries the core generation, so the model is prepared again beside them."""
    checkpoint = tmp_path / "default_model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    monkeypatch.setattr(helios.embedded, "default_model_dir", lambda: checkpoint)
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path / "cache"))
    stale = tmp_path / "cache" / "embedded" / embedded.checkpoint_digest(checkpoint)[:16]
    stale.mkdir(parents=True)
    (stale / "model.core").write_bytes(b"a core with pickled programs")
    prepared = []

    def prepare(checkpoint, target, key, progress):
        prepared.append(target)
        target.mkdir()
        (target / "model.core").write_bytes(b"a core with program images")

    monkeypatch.setattr(embedded, "_prepare", prepare)
    core = embedded.embedded_core(progress=lambda line: None)
    assert prepared == [core.path.parent] and core.path.parent != stale
    assert core.path.parent.name.endswith(embedded.CORE_GENERATION)
