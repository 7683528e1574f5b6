"""A stand-in for the embedded default model (the tiny chat checkpoint, seed 5) prepared into a model
cache by `helios.embedded.prepared.embedded_core` itself (one decode batch), once per run for every
xdist worker; each test gets a private copy of the checkpoint and the cache (the cache key is the
checkpoint's content digest, so the copy finds its core), which it may change freely."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.shared_prepare import prepared_once, shared_root


def _point(monkeypatch, checkpoint: Path, cache: Path) -> None:
    """Points `helios.embedded` at `checkpoint` and `cache`, with one decode batch, through `monkeypatch`."""
    import helios.embedded
    from helios.embedded import prepared as embedded

    monkeypatch.setattr(helios.embedded, "default_model_dir", lambda: checkpoint)
    monkeypatch.setenv(embedded.CACHE_ENV, str(cache))
    monkeypatch.setattr(embedded, "DECODE_BATCHES", (1,))


def embedded_copy(base: Path, into: Path, monkeypatch) -> Path:
    """`into/default_model` (the checkpoint) and `into/cache` (its prepared core) copied from the run's
    once-prepared cache under `base`'s shared root, with `monkeypatch` pointing `helios.embedded` at them
    (default_model_dir, the cache variable, one decode batch); the checkpoint's path."""
    from helios.embedded import prepared as embedded
    from ignition.hf_checkpoints import QWEN3
    from support.chat_checkpoint import write_chat_checkpoint

    root = shared_root(base) / "embedded-default-model"
    done = root / ".prepared"

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        checkpoint = write_chat_checkpoint(QWEN3, root / "default_model", seed=5)
        with pytest.MonkeyPatch.context() as patch:
            _point(patch, checkpoint, root / "cache")
            core = embedded.embedded_core(progress=lambda line: None)
        assert core.path.is_file() and core.path.is_relative_to(root / "cache"), core
        done.touch()

    prepared_once(root, done, prepare)
    checkpoint = into / "default_model"
    shutil.copytree(root / "default_model", checkpoint)
    shutil.copytree(root / "cache", into / "cache")
    _point(monkeypatch, checkpoint, into / "cache")
    return checkpoint
