"""`helios.server.start_trace` (HELIOS_START_TRACE) and the engine process's device warm-up while it waits
for its order (`helios.server.engine_process.warm_device`); the trace of a whole served start is checked in
tests/e2e/test_server.py."""

from __future__ import annotations

import pytest
import torch

from helios.server import start_trace
from helios.server.engine_process import warm_device


@pytest.mark.parametrize("value", [None, "", "0"])
def test_the_trace_is_off_unless_asked_for(capfd, monkeypatch, value):
    if value is None:
        monkeypatch.delenv(start_trace.ENV, raising=False)
    else:
        monkeypatch.setenv(start_trace.ENV, value)
    start_trace.mark("serve: listening")
    assert capfd.readouterr() == ("", "")


def test_a_mark_is_one_line_of_time_process_and_step_on_stderr(capfd, monkeypatch):
    monkeypatch.setenv(start_trace.ENV, "1")
    start_trace.mark("engine: load order received")
    out, err = capfd.readouterr()
    prefix, rest = err.split(": ", 1)
    epoch, word, pid, step = rest.split(maxsplit=3)
    assert out == "" and prefix == "helios start trace" and err.count("\n") == 1
    assert float(epoch) > 0 and word == "pid" and int(pid) > 0 and step == "engine: load order received\n"


@pytest.mark.parametrize("device", ["cpu", "cpu:0", "meta"])
def test_no_device_warm_up_off_cuda(device):
    assert warm_device(device) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the warm-up of a device that cannot start")
@pytest.mark.parametrize("device", ["cuda", "cuda:7", "cuda:x"])
def test_a_cuda_device_that_cannot_start_is_left_to_the_load_quietly(capfd, monkeypatch, device):
    """No CUDA here: the thread ends without a word; the load says what fails, typed."""
    monkeypatch.setenv(start_trace.ENV, "1")
    thread = warm_device(device)
    thread.join(30)
    assert not thread.is_alive() and capfd.readouterr() == ("", "")
