"""Programs captured in worker processes are the bytes a serial capture gives, arrive in job order,
and fail with the capture's own error type; jobs that cannot travel are captured in this process."""

from __future__ import annotations

import dataclasses

import pytest

from helios.ignition import capture_pool
from helios.ignition.architecture import CheckpointError
from helios.ignition.capture_pool import CaptureJob, capture_all
from helios.ignition.program_spec import Capacity, Operation, ProgramOptions

from .conftest import PAGE_TOKENS
from .hf_checkpoints import QWEN2

JOBS = [CaptureJob(Operation.DECODE, Capacity(1, 1), ProgramOptions()),
        CaptureJob(Operation.PREFILL, Capacity(1, 8), ProgramOptions(token_logprobs=True))]


def test_workers_capture_the_serial_bytes_in_job_order_and_a_worker_error_keeps_its_type(prepare):
    """One pool (spawning its workers costs more than the captures): the jobs before the failing one
    arrive in order with the serial bytes, then the failing job's error ends the call with its type."""
    arch = prepare(QWEN2, ()).recipe.architecture  # the recipe alone: no program captured
    arrived: list[tuple] = []
    serial = capture_all(arch, JOBS, PAGE_TOKENS, workers=1)
    bad = CaptureJob(Operation.DECODE, Capacity(2, 4), ProgramOptions())  # a DECODE variant needs T == R
    with pytest.raises(CheckpointError, match="T == R"):
        capture_all(arch, [*JOBS, bad], PAGE_TOKENS, workers=2,
                    on_captured=lambda index, program: arrived.append((index, program)))
    assert [index for index, _ in arrived] == [0, 1]
    assert [p.program for _, p in arrived] == [p.program for p in serial]
    assert [p.spec for _, p in arrived] == [p.spec for p in serial]


def test_jobs_that_cannot_be_pickled_are_captured_here(prepare, monkeypatch):
    arch = prepare(QWEN2, ()).recipe.architecture  # the recipe alone: no program captured
    local = dataclasses.replace(JOBS[0], options=ProgramOptions(multimodal=lambda: None))
    other = CaptureJob(Operation.DECODE, Capacity(2, 2), ProgramOptions())
    assert not capture_pool._picklable(arch, [local])
    monkeypatch.setattr(capture_pool, "ProcessPoolExecutor", None)  # any use of a pool would fail
    monkeypatch.setattr(capture_pool, "capture_program",
                        lambda arch, operation, capacity, page_tokens, options: (operation, capacity))
    assert capture_all(arch, [local, other], PAGE_TOKENS, workers=4) == [
        (Operation.DECODE, Capacity(1, 1)), (Operation.DECODE, Capacity(2, 2))]


def test_default_workers_leave_half_the_cpus(monkeypatch):
    monkeypatch.setattr(capture_pool.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert capture_pool.default_workers(20, 32) == 8
    assert capture_pool.default_workers(3, 32) == 3
    assert capture_pool.default_workers(20, 2) == 1  # a tiny model captures here
    monkeypatch.setattr(capture_pool.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert capture_pool.default_workers(20, 32) == 1
