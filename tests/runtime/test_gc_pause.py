"""The cyclic garbage collector paused while a model loads (`helios.runtime.loading.gc_pause`)."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from helios.runtime.loading import gc_pause, model
from runtime.test_model_fixture import open_fixture


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_block_pauses_the_collector_and_frees_the_cycles_it_left_when_it_ends():
    class Cycle:
        pass

    freed = threading.Event()
    with gc_pause.paused():
        assert not gc.isenabled()
        cycle = Cycle()
        cycle.me = cycle
        weakref.finalize(cycle, freed.set)
        del cycle
        assert not freed.is_set()  # garbage, but no collector to find it
    assert gc.isenabled() and freed.is_set()  # collected as the block ended


def test_blocks_overlapping_in_threads_keep_it_paused_until_the_last_ends():
    entered, release = threading.Event(), threading.Event()

    def load():
        with gc_pause.paused():
            entered.set()
            release.wait(5)

    other = threading.Thread(target=load)
    with gc_pause.paused():
        other.start()
        entered.wait(5)
    assert not gc.isenabled()  # the other thread's block still runs
    release.set()
    other.join()
    assert gc.isenabled()
    with gc_pause.paused():
        with gc_pause.paused():
            pass
        assert not gc.isenabled()  # nested: still paused
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled_and_an_error_resumes_it():
    gc.disable()
    with gc_pause.paused():
        pass
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(RuntimeError, match="load failed"):
        with gc_pause.paused():
            raise RuntimeError("load failed")
    assert gc.isenabled()


def test_load_model_runs_with_the_collector_paused(monkeypatch):
    seen = []
    load = model._load_model

    def watched(*args):
        seen.append(gc.isenabled())
        return load(*args)
    monkeypatch.setattr(model, "_load_model", watched)
    loaded = model.load_model(open_fixture())
    assert seen == [False] and gc.isenabled() and loaded.programs
