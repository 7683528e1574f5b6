"""Shared fixtures for core carrier tests: signing keys and a small payload core."""

from __future__ import annotations

import pytest

from helios.core.keys import SigningKey

from .builders import build_core, random_bytes


@pytest.fixture(scope="session")
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture(scope="session")
def other_key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture()
def small_core(tmp_path, key):
    """A payload core with the manifest's resources plus two 3 KiB blobs; returns its path."""
    path = tmp_path / "small.core"
    build_core(path, [key], extra={"blob.a": random_bytes(3072, 1), "blob.b": random_bytes(3072, 2)})
    return path
