"""The embedded model's cache and its publisher key: a core is found by the key that signed it.

Before, the cached core was found by the checkpoint digest and core generation alone: once the
cache's key files were removed (a new key is made on the next start), the old core, signed by the
lost key, was returned and refused at every start ("no trusted key signed the core") until the
cache was cleared by hand; a public key file lost beside its private key failed every start too.
Its first-use progress lines, with standard error closed (`2>&-`), went into standard output (the
generated text of `helios generate`). `_prepare` is replaced by a stub that records where it
prepares and reports one progress line (the preparation itself is `tests/server/test_app_embedded.py`'s)."""

from __future__ import annotations

import sys

import pytest

import helios.embedded
from helios.core.keys import load_signing_key, parse_public_key
from helios.embedded import prepared as embedded


@pytest.fixture
def cache(tmp_path, monkeypatch):
    checkpoint = tmp_path / "default_model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    monkeypatch.setattr(helios.embedded, "default_model_dir", lambda: checkpoint)
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path / "cache"))
    prepared = []

    def prepare(checkpoint, target, key, progress):
        prepared.append((target, load_signing_key(key).key_id))
        progress("preparing (a progress line)")
        target.mkdir()
        (target / "model.core").write_bytes(b"a core signed by the key above")

    monkeypatch.setattr(embedded, "_prepare", prepare)
    return tmp_path / "cache" / "embedded", prepared


def public_key_id(core: embedded.EmbeddedCore) -> bytes:
    return parse_public_key(core.public_key.read_text()).key_id


def test_a_core_signed_by_a_removed_key_is_prepared_again_with_the_new_one(cache):
    root, prepared = cache
    first = embedded.embedded_core(progress=lambda line: None)
    assert [target for target, _ in prepared] == [first.path.parent]
    assert prepared[0][1] == public_key_id(first)
    assert embedded.embedded_core(progress=lambda line: None) == first and len(prepared) == 1
    for name in (embedded.KEY_NAME, embedded.KEY_NAME + ".pub"):
        (root / name).unlink()
    second = embedded.embedded_core(progress=lambda line: None)
    assert len(prepared) == 2 and second.path.parent == prepared[1][0] != first.path.parent
    assert prepared[1][1] == public_key_id(second) != prepared[0][1]  # the new key signed it, and is trusted


def test_a_removed_private_key_alone_makes_a_new_pair(cache):
    root, prepared = cache
    first = embedded.embedded_core(progress=lambda line: None)
    (root / embedded.KEY_NAME).unlink()  # the stale public key is left
    second = embedded.embedded_core(progress=lambda line: None)
    assert len(prepared) == 2 and second.path != first.path
    assert prepared[1][1] == public_key_id(second)


def test_a_lost_public_key_file_is_written_again_from_the_private_key(cache):
    root, prepared = cache
    first = embedded.embedded_core(progress=lambda line: None)
    trusted = first.public_key.read_text()
    first.public_key.unlink()
    assert embedded.embedded_core(progress=lambda line: None) == first and len(prepared) == 1
    assert parse_public_key(first.public_key.read_text()) == parse_public_key(trusted)


def test_first_use_progress_is_dropped_with_standard_error_closed(cache, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stderr", None)
    embedded.embedded_core()  # its own progress: standard error
    assert len(cache[1]) == 1
    assert capsys.readouterr().out == ""
