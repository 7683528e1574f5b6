"""The load's imports ahead: on a thread of their own, awaited before anything that may import them."""

from __future__ import annotations

import logging
import sys
import threading

import pytest

from helios.runtime.loading import import_ahead, programs


@pytest.fixture
def slow_import(monkeypatch):
    """`importlib.import_module` as the import thread sees it: records the names, blocks until released."""
    release, imported = threading.Event(), []

    def import_module(name):
        assert release.wait(10)
        imported.append((name, threading.current_thread().name))
        if name == "helios_missing_module":
            raise ImportError(name)

    monkeypatch.setattr(import_ahead.importlib, "import_module", import_module)
    return release, imported


def test_the_imports_run_on_their_own_thread_and_wait_returns_when_they_ended(slow_import):
    release, imported = slow_import
    import_ahead.start(("helios_not_imported_yet",))
    waiter = threading.Thread(target=import_ahead.wait)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and imported == []  # still importing: wait waits
    release.set()
    waiter.join(10)
    assert not waiter.is_alive() and imported == [("helios_not_imported_yet", "helios-load-imports")]
    assert import_ahead._PENDING == []


def test_a_failing_import_is_left_to_where_it_is_needed(slow_import, caplog):
    release, imported = slow_import
    release.set()
    with caplog.at_level(logging.DEBUG, logger=import_ahead.__name__):
        import_ahead.start(("helios_missing_module", "helios_other_module"))
        import_ahead.wait()
    assert [name for name, _ in imported] == ["helios_missing_module", "helios_other_module"]
    assert "helios_missing_module not imported ahead" in caplog.text


def test_nothing_starts_when_everything_is_imported(slow_import):
    import_ahead.start(("torch", "sys"))
    assert import_ahead._PENDING == [] and "torch" in sys.modules
    import_ahead.wait()  # returns at once


def test_torchs_deserializer_waits_for_the_imports_ahead(monkeypatch):
    """A program left to torch's path deserializes only after the imports ahead ended (two threads
    importing torch's circular packages at once can fail)."""
    order = []
    monkeypatch.setattr(programs.import_ahead, "wait", lambda: order.append("wait"))

    def deserialize(image):
        order.append("deserialize")
        raise RuntimeError("stop here")

    monkeypatch.setattr(programs, "deserialize_program", deserialize)
    with pytest.raises(RuntimeError, match="stop here"):
        programs._with_torch(object(), {}, None, 0)
    assert order == ["wait", "deserialize"]
