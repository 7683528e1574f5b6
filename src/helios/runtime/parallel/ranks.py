"""Tensor-parallel execution: rank zero schedules, every rank runs the same programs, all or none commit.

Rank zero's `RankedExecutor` stands in for the `Executor` the engine drives. For each plan it

1. broadcasts a `StepMessage` - the self-contained plan: the specs of requests it names for the
   first time, the ids released since the previous plan, its rows and grammar masks - over the
   group in one preallocated int64 buffer (`helios.runtime.parallel.rank_channel`), so every peer's
   own `Packer`, applying the same plans in the same order, packs exactly rank zero's inputs;
2. runs the plan on its own rank while every peer runs it on theirs (`serve_rank`); the programs
   meet in their ``helios::all_reduce`` / ``all_gather`` collectives;
3. gathers every rank's verdict (`agree`): its status and its completion record. Only when every
   rank validated its record and all records are equal does rank zero return the results, which
   the engine then commits; otherwise the plan fails on every rank (`CohortRejected`): rank zero's
   engine fails its requests and no peer holds request state that could commit it.

Two execution frames: `launch` sends a LAUNCH message and launches on rank zero; `finish` sends
a FINISH message (the submission's sequence) and every rank finishes its oldest launched plan and
agrees on it, so peers mirror the engine's launch/finish order exactly and, on CUDA, rank zero
packs and launches round N+1 while every device still runs round N. A plan launched `alone` (the
engine's one frame: it finishes the plan before launching another) crosses at its `finish` as a
single STEP message, as `run` does. A launch that fails on a rank is reported at its finish, which
every rank reaches. Every rank keeps `PhaseTimers` (`helios.runtime.parallel.rank_timing`);
`timings` gathers them.

A dead or silent rank fails the model, never hangs it: every CPU collective is bounded by the
group's timeout, and on CUDA every step by a `StepDeadline` of the same length (device collectives
never block the host; the deadline aborts the NCCL communicator, which ends them); a
`CollectiveError` breaks the executor for good (`RankFailure` on every later plan), and
`mark_failed` (called by the peer monitor) does the same between steps. A `RankFailure` says only
that a rank failed: it becomes the message of every request it ends, and the cause (gloo's or
NCCL's own text, with its source paths, or how a rank process ended) is for the operator, so
`mark_failed` logs it once (the server's log). It does not abort the
device group itself: the model worker may be about to replay a CUDA graph whose collectives would
then run on a freed communicator; a step already waiting on the lost rank ends at its deadline.
While no plan runs, the monitor calls `keepalive`, a KEEPALIVE message answered
by one all_reduce from every rank, so an idle group still notices a lost rank (and peers, which
wait for messages under the same timeout, notice a lost rank zero). A broken executor sets
`WorkerStats.healthy` to False (`/health`).

Thread ownership: `run`, `launch` and `finish` on the model worker; `keepalive`, `mark_failed`,
`stop` and `timings` from any thread (a lock serializes every use of the group).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from helios.abi.collectives import CollectiveError, RankGroup
from helios.runtime.execution.host_staging import GroupRetirement
from helios.errors import ExecutionError
from helios.runtime.loading.cuda_graphs import release_graphs
from helios.runtime.execution.executor import Executor
from helios.runtime.execution.step_output import Launched, StepOutput
from helios.runtime.records.plan import StepPlan
from helios.runtime.parallel.rank_deadline import StepDeadline
from helios.runtime.parallel.rank_timing import PhaseTimers, run_phase
from helios.runtime.parallel.rank_channel import StepChannel
from helios.runtime.parallel.rank_wire import MessageKind, StepMessage, WireError
from helios.runtime.records.stats import WorkerStats

_REASON_BYTES = 256  # of a rank's failure message in its verdict
_STOPPED = "the tensor-parallel group was stopped"
_LOG = logging.getLogger(__name__)


class RankFailure(ExecutionError):
    """A rank died, stopped answering or broke the group: the tensor-parallel model cannot run.
    Its message is a client's (`RankFailure.lost`); the cause is in the log (`mark_failed`)."""

    @classmethod
    def lost(cls) -> "RankFailure":
        return cls("tensor-parallel model failed: a tensor-parallel rank failed or stopped answering "
                   "(the server log says why)")


class CohortRejected(ExecutionError):
    """A rank rejected this plan's completion, or the ranks' records differ: nothing is committed."""


def agree(group: RankGroup, executor: Executor, plan: StepPlan, error: BaseException | None) -> None:
    """Every rank's verdict on `plan`; raises `CohortRejected` on every rank unless all accept.

    A verdict is the rank's status (0 accepted), its completion frame as int64 and its failure
    message; gathering them gives every rank the same view, so all decide alike.
    """
    completion = executor.model.buffers[executor.model.prepared.manifest.completion.buffer]
    frame = completion[plan.frame].reshape(-1).view(torch.int64).cpu()  # a device buffer on CUDA
    if error is not None or plan.variant is None:
        frame = torch.zeros_like(frame)
    reason = f"{type(error).__name__}: {error}".encode("utf-8")[:_REASON_BYTES] if error is not None else b""
    reason_words = torch.frombuffer(bytearray(reason.ljust(_REASON_BYTES, b"\0")), dtype=torch.int64)
    verdict = torch.cat((torch.tensor([int(error is not None)]), frame, reason_words))
    verdicts = group.all_gather(verdict)
    for rank, theirs in enumerate(verdicts):
        if theirs[0] != 0:
            message = theirs[1 + frame.numel():].view(torch.uint8).numpy().tobytes().rstrip(b"\0")
            raise CohortRejected(f"rank {rank} rejected submission {plan.sequence}: {message.decode('utf-8', 'replace')}")
    for rank, theirs in enumerate(verdicts[1:], 1):
        if not torch.equal(theirs, verdicts[0]):
            raise CohortRejected(f"rank {rank}'s completion record of submission {plan.sequence} differs from rank 0's")


@dataclass(frozen=True)
class RankLaunched:
    """A plan every rank launched (`RankedExecutor.launch`); `finish` completes it on every rank.
    `alone`: not launched yet - `finish` runs it on every rank in one STEP exchange."""

    plan: StepPlan
    launched: Launched | None  # None when rank zero's launch failed (`error`) or the plan is `alone`
    error: Exception | None
    alone: bool = False


class RankedExecutor:
    """Rank zero's executor for N ranks (see the module docstring): a `PlanExecutor`."""

    def __init__(self, executor: Executor, group: RankGroup, stats: WorkerStats,
                 on_failure: Callable[[str], None] = lambda reason: None):
        self.model = executor.model
        self.images = None  # vision-language cores are prepared for one rank
        self._executor = executor
        self._group = group
        retire_over_group(executor, group)
        self.timers = PhaseTimers()
        self._channel = StepChannel(group, self.timers)
        self._stats = stats
        self._on_failure = on_failure
        self._lock = threading.Lock()  # guards _failure
        self._group_lock = threading.Lock()  # one exchange on the group at a time
        self._failure: str | None = None
        self._last_exchange = time.monotonic()
        self._deadline = _deadline(group, "helios-rank-0-deadline")

    @property
    def packer(self):
        """Rank zero's packer (it applies the same plans as every peer's)."""
        return self._executor.packer

    @property
    def failure(self) -> str | None:
        """Why the group can no longer run plans (failed or stopped), or None."""
        return self._failure

    def mark_failed(self, reason: str) -> None:
        """The group is unusable: every later plan fails; health turns false; `reason` (the raw
        cause, never shown to clients) is logged. Idempotent."""
        if self._close(reason):
            _LOG.error("the tensor-parallel group failed; requests in flight end with an error and the model "
                       "serves no more: %s", reason)
            self._stats.healthy = False
            self._on_failure(reason)

    def _close(self, reason: str) -> bool:
        with self._lock:
            if self._failure is not None:
                return False
            self._failure = reason
            return True

    @property
    def all_reduce_path(self) -> str:
        """How the programs' all-reduces run ("symmetric", "nccl" or "gloo"; see `RankGroup`)."""
        return self._group.all_reduce_path

    @property
    def overlaps(self) -> bool:
        """Whether a second execution frame pays off (rank zero's own executor's answer)."""
        return self._executor.overlaps

    @contextlib.contextmanager
    def _exchange(self, message: StepMessage, step: str):
        """Under the group lock: sends `message` to the peers, then runs the body under the step
        deadline; a collective failure there fails the group (`RankFailure`)."""
        with self._group_lock:
            self._check()
            try:
                self._channel.send(message)
                with _guarded(self._deadline, step):
                    yield
            except CollectiveError as failure:
                self.mark_failed(str(failure))
                raise self._rank_failure() from failure
            finally:
                self._last_exchange = time.monotonic()

    def launch(self, plan: StepPlan, *, alone: bool = False) -> RankLaunched:
        """Every rank launches `plan` (a LAUNCH message, then rank zero's own launch). A local
        failure is kept for `finish`, which every rank must reach to stay in step. A plan launched
        `alone` is only recorded: its `finish` runs it on every rank in one STEP message."""
        if alone:
            return RankLaunched(plan, None, None, alone=True)
        with self._exchange(StepMessage(MessageKind.LAUNCH, plan), f"launch of submission {plan.sequence}"), \
                self.timers.phase("launch"):
            launched, error = self._local(lambda: self._executor.launch(plan))
        return RankLaunched(plan, launched, error)

    def finish(self, launched: RankLaunched) -> StepOutput:
        """Every rank finishes its oldest launched plan (a FINISH message) and they agree on it."""
        plan = launched.plan
        if launched.alone:
            return self.run(plan)
        with self._exchange(StepMessage(MessageKind.FINISH, sequence=plan.sequence), f"submission {plan.sequence}"):
            output, error = None, launched.error
            if error is None:
                with self.timers.phase("finish"):
                    output, error = self._local(lambda: self._executor.finish(launched.launched))
            with self.timers.phase("agree"):
                agree(self._group, self._executor, plan, error)
        if error is not None:
            raise error
        return output

    def run(self, plan: StepPlan) -> StepOutput:
        """`launch` and `finish` in one STEP message (one execution frame)."""
        with self._exchange(StepMessage(MessageKind.STEP, plan), f"submission {plan.sequence}"):
            with self.timers.phase(run_phase(plan.operation)):
                output, error = self._local(lambda: self._executor.run(plan))
            with self.timers.phase("agree"):
                agree(self._group, self._executor, plan, error)
        if error is not None:
            raise error
        return output

    def keepalive(self, idle_s: float) -> None:
        """When the group has been idle `idle_s` and no plan runs: one exchange with every rank.
        (A call before then changes nothing: the idle time counts from the last exchange.)"""
        if self._failure is not None or not self._group_lock.acquire(blocking=False):
            return
        if time.monotonic() - self._last_exchange < idle_s:
            self._group_lock.release()
            return
        try:
            self._channel.send(StepMessage(MessageKind.KEEPALIVE))
            self._group.all_reduce(torch.ones(1, dtype=torch.int64))
        except CollectiveError as failure:
            self.mark_failed(str(failure))
        finally:
            self._last_exchange = time.monotonic()
            self._group_lock.release()

    def timings(self, reset: bool = False) -> list[PhaseTimers]:
        """Every rank's phase timers (rank order), in one exchange; `reset` zeroes them after."""
        with self._group_lock:
            self._check()
            try:
                self._channel.send(StepMessage(MessageKind.TIMINGS, reset=reset))
                gathered = self._group.all_gather(self.timers.as_tensor())
            except CollectiveError as failure:
                self.mark_failed(str(failure))
                raise self._rank_failure() from failure
            finally:
                self._last_exchange = time.monotonic()
        if reset:
            self.timers.reset()
        return [PhaseTimers.from_tensor(values) for values in gathered]

    def stop(self) -> None:
        """Tells the peers to leave (rank zero shutting down; a broken group gets no message) and
        releases this rank's device group."""
        with self._group_lock:
            try:
                if self._failure is None:
                    self._channel.send(StepMessage(MessageKind.STOP))
                    self._close(_STOPPED)
            except CollectiveError as failure:
                self.mark_failed(str(failure))
            finally:
                if self._deadline is not None:
                    self._deadline.close()
                release_graphs(self._executor.model.programs)  # NCCL teardown waits for graphs using it
                self._group.abort()  # no step runs now: releases the NCCL communicator, waiting on no peer

    def _check(self) -> None:
        if self._failure is not None:
            raise self._rank_failure()

    def _rank_failure(self) -> RankFailure:
        """What a request the broken (or stopped) group ends is told."""
        if self._failure == _STOPPED:
            return RankFailure(f"tensor-parallel model failed: {_STOPPED}")
        return RankFailure.lost()

    @staticmethod
    def _local(call):
        try:
            return call(), None
        except CollectiveError:
            raise
        except Exception as error:  # noqa: BLE001 - reported through agreement, re-raised after it
            return None, error


def retire_over_group(executor: Executor, group: RankGroup) -> None:
    """A core with host staging tables reuses a frame only once every rank retired its consumer:
    every rank checks that with one MIN all-reduce over the group's gloo group (in the same pack of
    the same submission; `helios.runtime.execution.host_staging`)."""
    staging = getattr(executor.packer, "host_staging", None)
    if staging is not None:
        staging.use_retirement(GroupRetirement(group.process_group))


def serve_rank(executor: Executor, group: RankGroup) -> None:
    """A peer's loop: run rank zero's plans until STOP. Raises `CollectiveError` when the group
    breaks (rank zero died or a rank stopped answering)."""
    timers = PhaseTimers()
    retire_over_group(executor, group)
    channel, deadline = StepChannel(group, timers), _deadline(group, f"helios-rank-{group.rank}-deadline")
    launched: deque = deque()  # (plan, Launched or None, error): LAUNCHed, not yet FINISHed
    try:
        while True:
            message = channel.receive()
            if message.kind is MessageKind.STOP:
                return
            if message.kind is MessageKind.KEEPALIVE:
                group.all_reduce(torch.ones(1, dtype=torch.int64))
                continue
            if message.kind is MessageKind.TIMINGS:
                group.all_gather(timers.as_tensor())
                if message.reset:
                    timers.reset()
                continue
            if message.kind is MessageKind.LAUNCH:
                with _guarded(deadline, f"rank {group.rank}'s launch of submission {message.plan.sequence}"):
                    launched.append(_launch_step(executor, group, message, timers))
                continue
            if message.kind is MessageKind.FINISH:
                if not launched or launched[0][0].sequence != message.sequence:
                    raise WireError(f"rank {group.rank} has no launched submission {message.sequence} to finish")
                with _guarded(deadline, f"rank {group.rank}'s submission {message.sequence}"):
                    _finish_step(executor, group, *launched.popleft(), timers)
                continue
            with _guarded(deadline, f"rank {group.rank}'s submission {message.plan.sequence}"):
                _serve_step(executor, group, message, timers)
    finally:
        if deadline is not None:
            deadline.close()


def _peer_call(group: RankGroup, call):
    """(result, None) or (None, the failure); a broken group (`CollectiveError`) propagates."""
    try:
        return call(), None
    except CollectiveError:
        raise
    except Exception as failure:  # noqa: BLE001 - this rank rejects the cohort; the group decides
        return None, failure


def _agree_as_peer(executor: Executor, group: RankGroup, plan: StepPlan, error, timers: PhaseTimers) -> None:
    try:
        with timers.phase("agree"):
            agree(group, executor, plan, error)
    except CohortRejected:
        pass  # nothing to undo here: peers commit no request state


def _serve_step(executor: Executor, group: RankGroup, message: StepMessage, timers: PhaseTimers) -> None:
    with timers.phase(run_phase(message.plan.operation)):
        _, error = _peer_call(group, lambda: executor.run(message.plan))
    _agree_as_peer(executor, group, message.plan, error, timers)


def _launch_step(executor: Executor, group: RankGroup, message: StepMessage, timers: PhaseTimers):
    with timers.phase("launch"):
        launched, error = _peer_call(group, lambda: executor.launch(message.plan))
    return message.plan, launched, error


def _finish_step(executor: Executor, group: RankGroup, plan: StepPlan, launched, error, timers: PhaseTimers) -> None:
    if error is None:
        with timers.phase("finish"):
            _, error = _peer_call(group, lambda: executor.finish(launched))
    _agree_as_peer(executor, group, plan, error, timers)


def _deadline(group: RankGroup, name: str) -> StepDeadline | None:
    """A step deadline for a group with device collectives (CPU collectives bound themselves)."""
    if group.device_group is None:
        return None
    return StepDeadline(group.timeout.total_seconds(), group.abort, name)


def _guarded(deadline: StepDeadline | None, step: str):
    return contextlib.nullcontext() if deadline is None else deadline.guard(step)
