"""Fixtures the server test modules share."""

from __future__ import annotations

import asyncio

import pytest


@pytest.fixture(scope="module")
def runner():
    """One event loop per test module, for the module's in-process HTTP clients."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny core served in this process with two frontend workers, one per test module
    (`support.server_core.served_tiny_core`), shut down after the module. Modules that serve
    something else define their own `served` (and `app`), which take precedence."""
    from support.server_core import served_tiny_core

    with served_tiny_core(tmp_path_factory.getbasetemp(), frontend_workers=2) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    """The app (ASGI, in process) over the module's `served`."""
    from helios.server.app import create_app

    return create_app(served)


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """The shared tiny prepared core (`support.server_core.tiny_core`); a module may define its own."""
    from support.server_core import tiny_core

    return tiny_core(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def tokenizer_json(core) -> bytes:
    """`core`'s tokenizer.json bytes, as the engine process reads them."""
    from helios.core.reader import open_core
    from helios.runtime.loading.model import resource_of_kind

    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    return opened.read_resource(resource_of_kind(opened, "TOKENIZER"))
