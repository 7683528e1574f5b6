"""The engine process's device warm-up while it waits for its order
(`helios.server.engine_process.warm_device`), in a fresh process: the device's context and cuBLAS start
on its thread, and say so in the start trace."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

PROGRAM = """
import torch
from helios.server.engine_process import warm_device

assert not torch.cuda.is_initialized()
thread = warm_device("cuda:0")
thread.join(120)
print(torch.cuda.is_initialized(), thread.is_alive())
"""


def test_the_warm_up_starts_the_device_on_its_thread():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "HELIOS_START_TRACE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "False"]
    assert "engine: device warmed" in done.stderr
