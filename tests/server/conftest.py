"""Fixtures the server test modules share."""

from __future__ import annotations

import asyncio

import pytest


@pytest.fixture(scope="module")
def runner():
    """One event loop per test module, for the module's in-process HTTP clients."""
    with asyncio.Runner() as runner:
        yield runner
