"""The embedded model's cache and its publisher key: a core is found by the key that signed it.

Before, the cached core was found by the checkpoint digest and core generation alone: once the
cache's key files were removed (a new key is made on the next start), the old core, signed by the
lost key, was returned and refused at every start ("no trusted key signed the core") until the
cache was cleared by hand; a public key file lost beside its private key failed every start too.
Its first-use progress lines, with standard error closed (`2>&-`), went into standard output (the
generated text of `helios generate`). `_prepare` is replaced by a stub that records where it
prepares and reports one progress line (the preparation itself is `tests/server/test_app_embedded.py`'s).
Every start read the private key to name the core, so a cache prepared by another user (its key mode
0600) failed to serve; two first runs at once could both fail, one leaving a .pub without its key."""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import threading
from pathlib import Path

import pytest

import helios.embedded
from helios.core.errors import KeyFileError
from helios.core.keys import SigningKey, load_signing_key, parse_public_key, write_key_pair
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


def test_a_damaged_public_key_file_is_written_again_from_the_private_key(cache):
    """A .pub that does not parse (truncated, edited) failed every start with its KeyFileError."""
    root, prepared = cache
    first = embedded.embedded_core(progress=lambda line: None)
    trusted = first.public_key.read_text()
    first.public_key.write_text("# Helios Ed25519 public key\nnot a key line\n")
    assert embedded.embedded_core(progress=lambda line: None) == first and len(prepared) == 1
    assert parse_public_key(first.public_key.read_text()) == parse_public_key(trusted)


def test_a_public_key_file_of_another_key_is_not_trusted_for_a_new_core(cache, tmp_path):
    """A .pub replaced by another key's (its private key kept): the new core was named by the .pub's
    key id, signed by the private key and served with the .pub's key, refused at every start."""
    root, prepared = cache
    other = tmp_path / "other.key"
    write_key_pair(other, SigningKey.generate(), [embedded.NAMESPACE])
    root.mkdir(parents=True)
    write_key_pair(root / embedded.KEY_NAME, SigningKey.generate(), [embedded.NAMESPACE])
    (root / (embedded.KEY_NAME + ".pub")).write_text((tmp_path / "other.key.pub").read_text())
    core = embedded.embedded_core(progress=lambda line: None)
    assert len(prepared) == 1 and prepared[0][1] == public_key_id(core)  # the signer is the trusted key
    assert core.path.parent == prepared[0][0]
    assert embedded.embedded_core(progress=lambda line: None) == core and len(prepared) == 1


def test_first_use_progress_is_dropped_with_standard_error_closed(cache, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stderr", None)
    embedded.embedded_core()  # its own progress: standard error
    assert len(cache[1]) == 1
    assert capsys.readouterr().out == ""


def test_a_prepared_cache_is_served_without_reading_its_private_key(cache, monkeypatch):
    """The key id comes from the .pub: a cache prepared by another user, whose private key this one
    may not read, is served while its core and .pub are there; only a lost .pub needs the private key."""
    root, prepared = cache
    first = embedded.embedded_core(progress=lambda line: None)
    read_bytes = Path.read_bytes

    def unreadable_key(path):
        if path == root / embedded.KEY_NAME:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", unreadable_key)
    assert embedded.embedded_core(progress=lambda line: None) == first and len(prepared) == 1
    first.public_key.unlink()
    with pytest.raises(KeyFileError, match="cannot read private key .*Permission denied"):
        embedded.embedded_core(progress=lambda line: None)
    assert (root / embedded.KEY_NAME).is_file()  # not replaced by a new pair


def test_a_first_run_coming_between_the_others_key_files_waits_for_them(tmp_path, monkeypatch):
    """Run B starts while run A's `write_key_pair` has written the private key and not yet created its
    .pub (at that os.open). B wrote the .pub itself, A's exclusive create of it failed, deleting A's
    private key, and A failed ("cannot read private key"), leaving a .pub without its private key; B
    now waits on the lock A holds (A goes on once B reaches flock) and both use A's pair."""
    root = tmp_path / "embedded"
    root.mkdir()
    public = root / (embedded.KEY_NAME + ".pub")
    real_open, real_flock = os.open, fcntl.flock
    outcome, other_waits = [], threading.Event()

    def other_run():
        try:
            outcome.append(embedded._publisher_key(root))
        except BaseException as error:  # noqa: BLE001 - asserted below
            outcome.append(error)
        finally:
            other_waits.set()

    other = threading.Thread(target=other_run, daemon=True)

    def flock(fd, operation):
        if threading.current_thread() is other:
            other_waits.set()  # at the lock: it has it once this run is done
        return real_flock(fd, operation)

    def between_key_files(path, flags, *args, **kwargs):
        if os.fspath(path) == os.fspath(public) and other.ident is None:
            other.start()
            assert other_waits.wait(10)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(os, "open", between_key_files)
    first = embedded._publisher_key(root)
    other.join(10)
    assert outcome == [first]
    assert first == (public, load_signing_key(root / embedded.KEY_NAME).key_id.hex()[:16])
    assert parse_public_key(public.read_text()).key_id.hex()[:16] == first[1]
