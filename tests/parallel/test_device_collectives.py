"""The device side of a rank group, checked without a GPU: device tensors (here `meta` ones) go to
the group's device process group, whose collectives are only enqueued (`wait()` without a timeout:
no host synchronisation, so they can be captured into CUDA graphs); a step whose device work
outlives the collective timeout aborts the device group and fails with a `CollectiveError`; rank
zero releases its device group when it stops."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from helios.abi.collectives import CollectiveError, RankGroup
from helios.runtime.parallel.rank_deadline import StepDeadline
from helios.runtime.parallel.ranks import RankedExecutor
from helios.runtime.records.stats import WorkerStats

HANG_GUARD_S = 60


class FakeDeviceGroup:
    """Records what a RankGroup asks of its NCCL process group."""

    def __init__(self, fail: bool = False):
        self.calls: list[tuple] = []
        self.fail = fail

    def _work(self, name: str):
        if self.fail:
            raise RuntimeError("NCCL communicator was aborted on rank 0.\nmore detail")
        return SimpleNamespace(wait=lambda *args: self.calls.append((name, "wait", args)))

    def allreduce(self, tensors):
        self.calls.append(("allreduce", tuple(t.shape for t in tensors)))
        return self._work("allreduce")

    def _allgather_base(self, out, tensor):
        self.calls.append(("allgather_base", tuple(out.shape), tuple(tensor.shape)))
        return self._work("allgather_base")

    def broadcast(self, tensors, options):
        self.calls.append(("broadcast", options.rootRank))
        return self._work("broadcast")

    def abort(self):
        self.calls.append(("abort",))


def device_group(fake: FakeDeviceGroup | None) -> RankGroup:
    return RankGroup(object(), 0, 2, timedelta(seconds=5), fake)  # the CPU group is never used here


def test_device_collectives_go_to_the_device_group_and_never_wait_on_the_host():
    fake = FakeDeviceGroup()
    group = device_group(fake)
    x = torch.empty((3, 4), device="meta")
    group.all_reduce(x)
    group.all_gather_into(torch.empty((2, 3, 4), device="meta"), x)
    group.broadcast(x, 1)
    assert fake.calls == [
        ("allreduce", ((3, 4),)), ("allreduce", "wait", ()),
        ("allgather_base", (2, 3, 4), (3, 4)), ("allgather_base", "wait", ()),
        ("broadcast", 1), ("broadcast", "wait", ()),
    ]


def test_a_device_tensor_needs_a_device_group():
    with pytest.raises(CollectiveError, match="no device process group"):
        device_group(None).all_reduce(torch.empty(2, device="meta"))


def test_a_refused_device_collective_is_a_collective_error():
    with pytest.raises(CollectiveError, match="all_reduce on rank 0 of 2 failed: NCCL communicator was aborted"):
        device_group(FakeDeviceGroup(fail=True)).all_reduce(torch.empty(2, device="meta"))


def test_abort_reaches_the_device_group_only_when_there_is_one():
    fake = FakeDeviceGroup()
    device_group(fake).abort()
    device_group(None).abort()
    assert fake.calls == [("abort",)]


def test_a_step_past_its_deadline_aborts_and_fails():
    aborted = threading.Event()
    deadline = StepDeadline(0.2, aborted.set)
    try:
        with pytest.raises(CollectiveError, match="submission 3 did not finish within the collective timeout"):
            with deadline.guard("submission 3"):
                assert aborted.wait(HANG_GUARD_S)  # a collective spinning until the abort ends it
        assert deadline.expired
        with pytest.raises(CollectiveError, match="submission 4"):  # the group stays aborted
            with deadline.guard("submission 4"):
                pytest.fail("a step ran on an aborted group")
    finally:
        deadline.close()


def test_steps_within_their_deadline_pass_and_their_own_errors_pass_through():
    aborts: list[bool] = []
    deadline = StepDeadline(HANG_GUARD_S, lambda: aborts.append(True))
    try:
        for _ in range(3):
            with deadline.guard("step"):
                pass
        with pytest.raises(ValueError, match="bad record"):
            with deadline.guard("step"):
                raise ValueError("bad record")
    finally:
        deadline.close()
    assert aborts == [] and not deadline.expired


def test_a_failed_executor_keeps_its_device_group_until_it_stops():
    """Between steps a failure only marks the model (the worker may be launching a graph that uses
    the communicator); stopping, after the engine has stopped, releases it."""
    fake = FakeDeviceGroup()
    stats = WorkerStats()
    ranked = RankedExecutor(SimpleNamespace(model=SimpleNamespace(programs=()), packer=None), device_group(fake), stats)
    ranked.mark_failed("rank 1 (process 42) exited with status -9")
    assert fake.calls == [] and not stats.healthy
    assert ranked.failure == "rank 1 (process 42) exited with status -9"
    ranked.stop()  # a failed group gets no STOP message
    assert fake.calls == [("abort",)]
