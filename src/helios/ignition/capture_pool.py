"""Program capture across worker processes: most of `prepare_core`'s time is torch.export tracing,
pure Python that holds the GIL, and the (operation, capacity) programs are independent, so
separate processes capture them side by side.

`capture_all` returns the programs in job order, exactly the bytes a serial capture gives (each
export is deterministic and starts from the same inputs). Workers are spawned (never forked: the
parent runs hashing threads, and a fork would copy their locks), trace with one intra-op thread
each, and hold no weights: a capture needs only the architecture, the capacity and the options.
With one worker, or when the jobs cannot be sent to a process, or when the pool breaks (a worker
killed), the remaining programs are captured here, one after another.

Ctrl-C reaches every process of the terminal's foreground group: the workers are started with SIGINT
blocked (they print no traceback of their own; a blocked signal mask survives the spawn's exec) and
this process, the one that answers it, ends them when anything stops the capture here (Ctrl-C,
SIGTERM's `Terminated`, a capture error), instead of waiting for the captures they are running.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Callable

from helios.ignition.architecture import Architecture
from helios.ignition.capture import CapturedProgram, capture_program
from helios.ignition.program_spec import Capacity, Operation, ProgramOptions

__all__ = ["CaptureJob", "capture_all", "default_workers"]

MAX_WORKERS = 8  # past this, spawning and importing torch costs more than the programs left to share
MIN_LAYERS = 8  # a shallower model's program traces in about the time a worker takes to start


@dataclass(frozen=True)
class CaptureJob:
    """One program to capture: the operation at one capacity with the core's program options."""

    operation: Operation
    capacity: Capacity
    options: ProgramOptions


def default_workers(num_jobs: int, num_layers: int) -> int:
    """Worker processes for `num_jobs` captures of a `num_layers` model: half the CPUs this process
    may use (tracing leaves the rest to the background hashing), at most MAX_WORKERS and one per
    job; none (1: capture here) below MIN_LAYERS layers."""
    if num_layers < MIN_LAYERS:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(num_jobs, cpus // 2, MAX_WORKERS))


def capture_all(arch: Architecture, jobs: list[CaptureJob], page_tokens: int, workers: int,
                on_captured: Callable[[int, CapturedProgram], None] = lambda index, program: None,
                watched: Future | None = None) -> list[CapturedProgram]:
    """Every job's program, in job order; `on_captured(index, program)` is called in that order as
    they arrive. `workers` <= 1 captures here. Capture errors propagate with their own type.

    `watched` (preparation's: the weights written to the output meanwhile, `CoreWriter.stored_early`)
    ends the capture with its error as soon as it fails (workers: at once; here: after the program
    being captured), instead of after every program: a full disk is reported when it happens."""
    done: list[CapturedProgram] = []

    def accept(program: CapturedProgram) -> None:
        _raise_failure(watched)
        on_captured(len(done), program)
        done.append(program)

    if workers > 1 and len(jobs) > 1 and _picklable(arch, jobs):
        try:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context,
                                     initializer=_init_worker) as pool:
                try:
                    with _interrupts_held():  # submitting the jobs spawns the workers
                        futures = [pool.submit(_capture, (arch, job, page_tokens)) for job in jobs]
                    for future in futures:
                        if watched is not None:
                            wait((future, watched), return_when=FIRST_COMPLETED)
                            _raise_failure(watched)
                        accept(future.result())
                except BaseException:
                    _stop_workers(pool)
                    raise
            return done
        except BrokenProcessPool:
            pass  # a worker died (killed, out of memory): capture what is left here
    for job in jobs[len(done):]:
        _raise_failure(watched)
        accept(capture_program(arch, job.operation, job.capacity, page_tokens, job.options))
    return done


def _raise_failure(watched: Future | None) -> None:
    """Raises `watched`'s error where it has failed."""
    if watched is not None and watched.done() and not watched.cancelled() and watched.exception() is not None:
        raise watched.exception()


def _picklable(arch: Architecture, jobs: list[CaptureJob]) -> bool:
    try:
        pickle.dumps((arch, jobs))
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


@contextlib.contextmanager
def _interrupts_held():
    """SIGINT blocked in this thread inside (a Ctrl-C meanwhile is delivered after): the worker
    processes started inside inherit the blocked mask, so the terminal's Ctrl-C is this process's alone."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancels the jobs not started and ends the workers running the others (a large model's capture
    runs for minutes; the executor would wait for it). The executor has no public way to end them."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)  # the executor sees its workers gone and stops


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _capture(work: tuple[Architecture, CaptureJob, int]) -> CapturedProgram:
    arch, job, page_tokens = work
    return capture_program(arch, job.operation, job.capacity, page_tokens, job.options)
