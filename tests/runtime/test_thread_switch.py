"""Python's thread switch interval shortened while a model loads (`helios.runtime.loading.thread_switch`)."""

from __future__ import annotations

import sys
import threading

import pytest

from helios.runtime.loading import model, thread_switch


def _approx(seconds: float):
    return pytest.approx(seconds, abs=2e-6)  # Python keeps the interval in whole microseconds


@pytest.fixture(autouse=True)
def default_interval():
    was = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(was)


def test_the_block_shortens_the_interval_and_puts_it_back():
    with thread_switch.shortened():
        assert sys.getswitchinterval() == _approx(thread_switch.LOAD_SWITCH_INTERVAL)
    assert sys.getswitchinterval() == _approx(0.005)
    sys.setswitchinterval(0.0001)
    with thread_switch.shortened():
        assert sys.getswitchinterval() == _approx(0.0001)  # never lengthened
    assert sys.getswitchinterval() == _approx(0.0001)


def test_blocks_nested_or_overlapping_in_threads_keep_it_short_until_the_last_ends():
    entered, release = threading.Event(), threading.Event()

    def load():
        with thread_switch.shortened():
            entered.set()
            release.wait(5)

    other = threading.Thread(target=load)
    with thread_switch.shortened():
        other.start()
        entered.wait(5)
        with thread_switch.shortened(0.001):  # nested, asking for a longer one: stays at the shortest
            assert sys.getswitchinterval() == _approx(thread_switch.LOAD_SWITCH_INTERVAL)
    assert sys.getswitchinterval() == _approx(thread_switch.LOAD_SWITCH_INTERVAL)  # the other still loads
    release.set()
    other.join()
    assert sys.getswitchinterval() == _approx(0.005)


def test_the_interval_is_put_back_when_a_block_raises():
    with pytest.raises(RuntimeError):
        with thread_switch.shortened():
            raise RuntimeError("the load failed")
    assert sys.getswitchinterval() == _approx(0.005)


def test_a_load_runs_at_the_short_interval_and_serving_at_the_one_before(monkeypatch):
    seen = []
    monkeypatch.setattr(model, "_load_model", lambda *args: seen.append(sys.getswitchinterval()) or "loaded")
    assert model.load_model(object()) == "loaded"
    assert seen == [_approx(thread_switch.LOAD_SWITCH_INTERVAL)]
    assert sys.getswitchinterval() == _approx(0.005)
