"""Triton kernels compiled side by side in worker processes before the CUDA graphs are captured.

A program's first warm-up run compiles each Triton kernel variant it launches (`cuda_graphs`), one
after another in this process: on a machine whose Triton cache is empty, about thirty variants and
most of a first load's time for an 8B core (bench/results/h200_session24_call2: 27 s of a 61 s load).
Which variants a load needs is known only by running its programs, so a load runs them twice:

1. a dry run of every graph about to be captured (`KernelCompiler.dry_run`; on one rank, made on
   stand-in arguments while the weights load, `helios.runtime.loading.dry_run_ahead`, else by the
   capture on the real ones): each Triton launch whose
   variant is not compiled yet is not made; its variant is sent to a worker process instead (the
   same source, signature, constants and options Triton would compile here, for this device's
   target), which compiles it, and builds its launcher, into Triton's on-disk cache. A skipped
   launch leaves its outputs unwritten, so the tensors it was given that are not the program's
   arguments (the op's own intermediates) are zeroed: later ops read zeros, never stale memory
   (an index read from one stays in range). Arguments (weights, caches, inputs) and the graph modules' own
   tensors (their constants: `KernelCompiler.protect`) are never touched.
   Every layer launches the same variants again: such a launch is known sent by its cache key
   (`_launch_key`, what Triton's `run` looks it up by) before Triton packs its arguments again.
2. `wait`, then the warm-up runs as before: each variant now loads from the cache in milliseconds.

The dry run changes only which launches are made, only on the thread that runs it (the weight
loader's thread, or any other, launches as usual), and only until it ends. A variant already in
Triton's on-disk cache (`cached_on_disk`: a machine that loaded this core before) is loaded and
launched here, as is one that cannot be sent (a kernel not importable by its module and name); one
that fails in a worker is compiled by the warm-up run itself, which raises its error.
Workers are never forked from the loading process (it runs a weight thread): where the platform has
it they are forked from multiprocessing's fork server, a clean process that imports torch, Triton
and the main module once (`WORKER_PRELOAD`), so eight workers cost one import instead of eight
(spawned, each imported them again beside the others); elsewhere they are spawned. They start with
the load, at a lower priority (`KernelCompiler.start`), so their start-up overlaps the programs'
building and the weight loading; after a process's first load they start only when a variant is
sent. Each load's workers take the load's Triton environment (`TRITON_*`: the cache directory),
not the one the fork server started with.
"""

from __future__ import annotations

import contextlib
import heapq
import importlib
import importlib.util
import itertools
import logging
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import CancelledError, Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

__all__ = ["KernelCompiler", "CompileJob", "compile_job", "default_compile_workers", "expected_seconds"]

_LOG = logging.getLogger(__name__)
_COMPILED_HERE = False  # a dry run has finished in this process (its kernels are compiled here now)
_PATCH_LOCK = threading.Lock()  # one dry run at a time per process (each replaces two JITFunction methods)
# An 8B core's first load compiles 41 variants: 14 workers against 8 on the H200 machine's 16 CPUs, three
# alternated pairs of empty-cache loads, each won by 14 (21.8, 21.9, 22.2 s against 23.0, 23.2, 22.4 s; the
# capture's wait for the workers 1.2-2.2 s against 2.2-3.0 s; bench/results/h200_session48_call1): 14 is
# that machine's CPUs less two, for the load's own threads.
MAX_WORKERS = 14
# Seconds a variant of these kernels takes to compile where it is well above the half second to one second
# of most (an 8B core's first load on the H200 machine's host, bench/results/h200_session42_call6: the
# prefill kernel 2.2-3.5 s a variant, the decode kernel 1.5-1.7 s). With `longest_first` (the default), a
# variant sent while every worker is busy waits in the compiler, and a freed worker takes the longest one
# waiting: the dry run sends the long prefill variants after most of the short decode ones, which queued
# ahead of them otherwise (an 8B core's first load: 20.6 s against 22.0 s in the order sent, four
# alternated pairs, each won by longest first; the capture's wait 3.3 s against 4.6 s;
# bench/results/h200_session43_call1).
COMPILE_SECONDS = {"helios.abi.triton_prefill._prefill_kernel": 3.0, "helios.abi.triton_decode._decode_kernel": 1.6}


def expected_seconds(job: "CompileJob") -> float:
    """The seconds `job` is expected to take to compile (`COMPILE_SECONDS`, else 1)."""
    return COMPILE_SECONDS.get(job.kernel, 1.0)


def default_compile_workers() -> int:
    """Worker processes for a load's kernel compiles: the CPUs this process may use, less one for
    the load itself, at most MAX_WORKERS; 0 (compile in the warm-up) with fewer than 3 CPUs."""
    cpus = _cpus()
    return 0 if cpus < 3 else min(MAX_WORKERS, cpus - 1)


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class CompileJob:
    """One Triton kernel variant, as `JITFunction._do_compile` would compile it, in picklable form."""

    module: str  # the kernel's module and attribute name (a module-level `@triton.jit` function)
    name: str
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    target: object  # triton.backends.compiler.GPUTarget

    @property
    def kernel(self) -> str:
        return f"{self.module}.{self.name}"


def compile_job(job: CompileJob) -> float:
    """Compiles `job` into Triton's on-disk cache (and, where this machine can build it, its launcher);
    the seconds it took. Runs in a worker process; needs no device."""
    import triton
    from triton.compiler import ASTSource

    started = time.perf_counter()
    source = ASTSource(_kernel(job), job.signature, job.constexprs, job.attrs)
    kernel = triton.compile(source, target=job.target, options=job.options)
    _build_launcher(source, kernel.metadata)
    return time.perf_counter() - started


def _kernel(job: CompileJob):
    """`job`'s kernel as Triton's compiler sees it: its module's attribute, or, in a process where
    Triton's interpreter is on (an interpreted kernel), a JITFunction of the same function."""
    from triton.runtime.jit import JITFunction

    kernel = getattr(importlib.import_module(job.module), job.name)
    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)


def _build_launcher(source, metadata) -> None:
    """The kernel's launcher module (C, built once per signature and cached on disk), best effort:
    a machine without the CUDA driver library builds it at the first launch instead."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(source, metadata)
    except Exception as error:  # noqa: BLE001 - the first launch builds it, with its own error
        _LOG.debug("launcher not built ahead: %s", error)


def _init_worker(triton_environment: dict[str, str] | None = None, owner_pid: int | None = None) -> None:
    """A worker's start: one thread, the loading process's `TRITON_*` variables (a worker forked from
    the fork server has the server's environment, from when it started), Triton's key of itself, and
    a watch that ends the worker once the loading process `owner_pid` is gone (`_exit_with`)."""
    if owner_pid is not None:
        _exit_with(owner_pid)
    torch.set_num_threads(1)
    if triton_environment is not None:
        for name in [name for name in os.environ if name.startswith("TRITON_")]:
            if name not in triton_environment:
                del os.environ[name]
        os.environ.update(triton_environment)
    _triton_key()  # imports Triton and hashes it while the programs load, not on the first job


OWNER_POLL_S = 0.5  # how often a compile worker checks that its loading process lives


def _exit_with(owner_pid: int) -> None:
    """Ends this worker once process `owner_pid` is gone. A loading process that is killed (an engine
    process stopped while it loads) never shuts its pool down, and its workers, children of the fork
    server, would wait on their queue for good (about 160 MB each)."""

    def watch() -> None:
        while True:
            time.sleep(OWNER_POLL_S)
            try:
                os.kill(owner_pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:  # alive, as another user's process: not ours to judge
                pass

    threading.Thread(target=watch, name="helios-compile-owner-watch", daemon=True).start()


def _triton_key() -> None:
    """Computes Triton's cache key of itself (`triton.runtime.cache.triton_key`: a hash of its sources
    and of libtriton, about 400 MB, once per process, 0.3-0.9 s) ahead of the first compile or cache
    lookup that needs it; the hashing releases the GIL, so a thread of the load does it beside the
    programs' building. Best effort: a Triton without it is left alone."""
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception as error:  # noqa: BLE001 - the first compile computes it, or raises, itself
        _LOG.debug("Triton's cache key not computed ahead: %s", error)


class KernelCompiler:
    """A pool of compile workers for one load (a context manager: the workers end with it).

    `dry_run(arguments)` runs the calling thread's Triton launches as described in the module
    docstring; `wait()` returns once every variant sent has been compiled (or failed). `executor`
    replaces the worker processes (tests). At most one variant is at each worker at a time; a variant
    sent while every worker is busy waits here until one is free, which then takes the waiting variant
    expected to compile longest with `longest_first` (the default; `expected_seconds`, the earliest
    sent among equals), else the earliest sent."""

    def __init__(self, workers: int, executor: Executor | None = None, longest_first: bool = True):
        self.workers = min(workers, _cpus())  # more processes than CPUs would only contend
        self.longest_first = longest_first
        self._pool: Executor | None = executor
        self._lock = threading.Lock()  # the waiting variants and the count at the workers
        self._waiting: list[tuple[float, int, CompileJob, Future]] = []  # a heap: (priority, order, job, its future)
        self._order = itertools.count()
        self._at_workers = 0
        self._jobs: dict[tuple, Future] = {}
        self._names: dict[tuple, str] = {}
        self._times: dict[tuple, list] = {}  # [sent, finished or None, label] (perf_counter), for the report
        self.skipped_launches = 0
        self._protected: set[int] | None = None  # within `dry_run`: the storages no skipped launch zeroes
        self.label = ""  # what the dry run is running (each variant's report names what sent it)
        self.ran_ahead = False  # dry-run already, on stand-ins (`helios.runtime.loading.dry_run_ahead`)
        self.revealed: dict[tuple, CompileJob] = {}  # every variant a dry run met, compiled or on disk already
        self.ahead_seconds = 0.0
        self._start = executor is None and workers > 0
        self._spawned = True  # `start` decides

    def start(self, spawn: bool = True) -> None:
        """Makes the worker pool (once; nothing without workers or without Triton). In a process's first
        load its workers start now, at the start of the load, spawned from a thread of lowered
        priority (`WORKER_NICENESS`, inherited by the processes): their start-up (importing torch and
        Triton, seconds) is done by the time the dry run on stand-ins sends the first variants, and
        takes only CPU time the load's own threads leave (spawned at normal priority with the load,
        they made building the programs 1.6x slower, bench/results/h200_session24_call3; spawned after
        the programs, they were still importing while the first variants waited,
        bench/results/h200_session26_call5). Triton's key of itself, which the dry run's first cache
        lookup needs, is computed meanwhile on a thread of its own (`_triton_key`). In later loads
        (their kernels mostly compiled in this process already) a worker starts only for a variant
        sent to it. Without `spawn` (a load that expects to compile nothing: `dry_run_record`) the
        workers of a first load wait for `spawn_workers`."""
        if not self._start or importlib.util.find_spec("triton") is None:  # no Triton: nothing compiles
            return
        self._start = False
        context = _worker_context()
        environment = {name: value for name, value in os.environ.items() if name.startswith("TRITON_")}
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=context, initializer=_init_worker,
                                         initargs=(environment, os.getpid()))
        self._spawned = _COMPILED_HERE  # later loads rarely compile: a worker starts for a variant sent
        if not _COMPILED_HERE:
            threading.Thread(target=_triton_key, name="helios-triton-key", daemon=True).start()
        if spawn:
            self.spawn_workers()

    def spawn_workers(self) -> None:
        """In a process's first load, starts every worker now, from a thread of lowered priority (once;
        see `start`); otherwise nothing."""
        if self._pool is None or self._spawned:
            return
        self._spawned = True
        threading.Thread(target=_spawn_niced, args=(self._pool, self.workers), name="helios-compile-spawn",
                         daemon=True).start()

    def __enter__(self) -> "KernelCompiler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for *_, future in waiting:  # never sent: the warm-up runs compile them
            future.set_exception(CancelledError("the compile workers were closed"))

    @property
    def active(self) -> bool:
        """Whether there are workers (`start` called, or an executor given)."""
        return self._pool is not None

    def sent(self, key: tuple) -> bool:
        """Whether the variant of `key` was sent to a worker already."""
        return key in self._jobs

    def submit(self, job: CompileJob, key: tuple) -> bool:
        """Sends `job` (once per `key`) to a free worker, or to the waiting variants when every worker is
        busy; False when there is no pool, or it broke (it is closed then: the variants not sent compile
        where they are launched)."""
        if self._pool is None:
            return False
        if key not in self._jobs:
            with self._lock:
                pool = self._pool
                if pool is None:  # closed since (a worker's failure, on the pool's thread)
                    return False
                held = self._at_workers >= self.workers
                if held:
                    future: Future = Future()
                    priority = -expected_seconds(job) if self.longest_first else 0.0  # else: the order sent
                    heapq.heappush(self._waiting, (priority, next(self._order), job, future))
                else:
                    self._at_workers += 1
            if not held:
                try:
                    future = self._send(job, pool)
                except _POOL_ERRORS:  # a broken pool (a worker killed), one shut down, no fork server
                    return False
            self._jobs[key] = future
            self._names[key] = job.kernel
            times = self._times[key] = [time.perf_counter(), None, self.label]
            future.add_done_callback(lambda _, times=times: times.__setitem__(1, time.perf_counter()))
        return True

    def _send(self, job: CompileJob, pool: Executor) -> Future:
        """`job` sent to `pool` (counted at the workers already, until it returns); a pool that cannot
        take it closes the compiler, and its error is raised."""
        try:
            future = pool.submit(compile_job, job)
        except _POOL_ERRORS as error:
            with self._lock:
                self._at_workers -= 1
            self._unavailable(error)
            raise
        future.add_done_callback(self._returned)
        return future

    def _returned(self, _: Future) -> None:
        """A worker is free: it takes the first waiting variant (the one expected to compile longest with
        `longest_first`), on the pool's thread that reports the result."""
        with self._lock:
            self._at_workers -= 1
            if not self._waiting or self._pool is None:
                return
            *_, job, held = heapq.heappop(self._waiting)
            self._at_workers += 1
            pool = self._pool
        try:
            future = self._send(job, pool)
        except _POOL_ERRORS as error:  # it broke meanwhile: this and every waiting variant compile at warm-up
            held.set_exception(error)
            return
        future.add_done_callback(lambda done: _settle(held, done))

    def _unavailable(self, error: BaseException) -> None:
        _LOG.warning("Triton compile workers unavailable (%s: %s); the warm-up compiles the rest",
                     type(error).__name__, error)
        self.close()

    @contextlib.contextmanager
    def dry_run(self, arguments: Iterable[torch.Tensor]) -> Iterator[None]:
        """Within: this thread's Triton launches of variants not yet compiled are sent to the workers
        and not made; the tensors such a launch was given outside `arguments`' storages are zeroed."""
        if self._pool is None:
            yield
            return
        try:
            from triton.runtime.jit import JITFunction
        except ImportError:
            yield
            return
        protected = {t.untyped_storage().data_ptr() for t in arguments if isinstance(t, torch.Tensor)}
        self._protected = protected
        try:
            with _patched(JITFunction, self, threading.get_ident(), protected):
                yield
        finally:
            self._protected = None

    def protect(self, tensors: Iterable) -> None:
        """Within `dry_run`: `tensors`' storages are never zeroed by a skipped launch, as the arguments'
        are not. A graph module's own tensors (the constants `helios.runtime.loading.step_calls` makes
        of its shape-only factories: ``ones`` combine weights, a rotary table of a position-free layer)
        are read by every later call, the capture's included: zeroed by a dry run that skipped the
        launch they were given to, they stayed zero (Llama 4's MoE combine weights, its first load on
        an empty Triton cache). Outside a dry run: nothing."""
        if self._protected is not None:
            self._protected.update(t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor))

    def wait(self) -> dict:
        """Blocks until every variant sent is compiled; {"variants", "failed", "seconds" (the seconds
        the workers spent, summed), "skipped_launches", "compiles"}: "compiles" lists each variant as
        (kernel, label when sent, sent, compile seconds, finished), the times in seconds after the
        first was sent."""
        global _COMPILED_HERE
        _COMPILED_HERE = True
        wait(list(self._jobs.values()))
        failed, seconds, compiles = [], 0.0, []
        first = min((times[0] for times in self._times.values()), default=0.0)
        for key, future in self._jobs.items():
            error = future.exception()
            took = 0.0
            if error is None:
                took = future.result()
                seconds += took
            else:  # the warm-up run compiles it here and raises what it raises
                failed.append(self._names[key])
                _LOG.warning("Triton kernel %s did not compile in a worker (%s: %s); the warm-up compiles it",
                             self._names[key], type(error).__name__, error)
            sent, finished, label = self._times[key]
            compiles.append((self._names[key], label, sent - first, took, (finished or time.perf_counter()) - first))
        return {"variants": len(self._jobs), "failed": failed, "seconds": seconds,
                "skipped_launches": self.skipped_launches, "compiles": compiles}


def _ready() -> None:
    return None


def _settle(held: Future, done: Future) -> None:
    """`held` (a variant that waited in the compiler) takes the outcome of its worker's future `done`."""
    if done.cancelled():
        held.set_exception(CancelledError("the compile workers were closed"))
    elif done.exception() is not None:
        held.set_exception(done.exception())
    else:
        held.set_result(done.result())


WORKER_NICENESS = 10  # added to the compile workers' scheduling niceness (Linux: the spawning thread's)


# What the fork server imports once for every worker it forks: the main module (a spawned or forked
# worker runs it otherwise: multiprocessing's rule), torch with this module, and Triton's compiler.
WORKER_PRELOAD = ("__main__", __name__, "triton.compiler", "triton.runtime.cache")


# What starting a worker raises when the pool cannot have one: a broken or shut-down pool
# (RuntimeError), or a fork server that ended (its preload raised: the connection to it fails).
_POOL_ERRORS = (RuntimeError, OSError, EOFError)


def _worker_context():
    """Multiprocessing's fork server where the platform has one (its preload set to `WORKER_PRELOAD`,
    which takes effect when it starts), else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(WORKER_PRELOAD))
    return context


def _spawn_niced(pool: ProcessPoolExecutor, workers: int) -> None:
    """Starts `pool`'s workers from this thread after lowering its own priority, which the processes
    (and a fork server started here, whose children they are) inherit (on Linux a thread's niceness is
    its own); elsewhere they start at the usual priority."""
    try:
        niceness = os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICENESS
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except (AttributeError, OSError) as error:  # not Linux, or not permitted: the usual priority
        _LOG.debug("compile workers spawn at the usual priority: %s", error)
    try:
        for _ in range(workers):
            pool.submit(_ready)
    except _POOL_ERRORS as error:  # shut down meanwhile (the load ended or failed), or no fork server
        _LOG.debug("compile workers not started: %s", error)


@contextlib.contextmanager
def _patched(jit_class, compiler: KernelCompiler, thread: int, protected: set[int]) -> Iterator[None]:
    """`jit_class.run` and `_do_compile` replaced for `thread` (see `KernelCompiler.dry_run`)."""

    def dry_do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        if threading.get_ident() != thread:
            return do_compile(self, key, signature, device, constexprs, options, attrs, warmup)
        variant = (id(self), key)
        if compiler.sent(variant):  # launched again (every layer): skipped, nothing looked up again
            return None
        job = _job_of(self, signature, device, constexprs, options, attrs)
        if job is not None:
            compiler.revealed[variant] = job
        if job is None or cached_on_disk(job) or not compiler.submit(job, variant):
            return do_compile(self, key, signature, device, constexprs, options, attrs, warmup)
        return None  # `run` returns without launching

    def skip(args, kwargs) -> None:
        compiler.skipped_launches += 1
        unwritten = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)
                     and value.untyped_storage().data_ptr() not in protected]
        if unwritten:
            torch._foreach_zero_(unwritten)  # one launch per device and dtype, not one per tensor

    def dry_run_method(self, *args, grid, warmup, **kwargs):
        here = threading.get_ident() == thread and not warmup
        if here and compiler.sent((id(self), _launch_key(self, args, kwargs))):
            skip(args, kwargs)  # a variant sent already (every layer launches it): not packed or looked up again
            return None
        kernel = run(self, *args, grid=grid, warmup=warmup, **kwargs)
        if kernel is None and here:
            skip(args, kwargs)
        return kernel

    with _PATCH_LOCK:
        run, do_compile = jit_class.run, jit_class._do_compile
        jit_class.run, jit_class._do_compile = dry_run_method, dry_do_compile
        try:
            yield
        finally:
            jit_class.run, jit_class._do_compile = run, do_compile


def _launch_key(fn, args: tuple, kwargs: dict):
    """The cache key `fn.run` computes for this launch (the variant's identity in its kernel cache), or
    None where this Triton's `run` cannot be followed (the launch then takes `run`'s own path). Its
    binder is run twice for a launch that goes on to `run`: a few microseconds, on the dry run only."""
    try:
        from triton import knobs
        from triton.runtime.driver import driver
        from triton.runtime.jit import compute_cache_key

        kwargs = dict(kwargs, debug=kwargs.get("debug", fn.debug) or knobs.runtime.debug,
                      instrumentation_mode=knobs.compilation.instrumentation_mode)
        _, key_cache, _, _, binder = fn.device_caches[driver.active.get_current_device()]
        _, specialization, options = binder(*args, **kwargs)
        return compute_cache_key(key_cache, specialization, options)
    except Exception as error:  # noqa: BLE001 - another Triton's internals: its own path decides
        _LOG.debug("Triton launch key not computed: %s", error)
        return None


def cached_on_disk(job: CompileJob) -> bool:
    """Whether Triton's on-disk cache already holds `job`'s variant (its compile would be a cache hit,
    as `triton.compile` looks it up); False where that cannot be told (another Triton's layout)."""
    try:
        import hashlib

        from triton._C.libtriton import get_cache_invalidating_env_vars
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.cache import get_cache_key, get_cache_manager

        source = ASTSource(_kernel(job), job.signature, job.constexprs, job.attrs)
        backend = make_backend(job.target)
        options = backend.parse_options(dict(job.options, **source.parse_options()))
        key = get_cache_key(source, backend, options, env_vars=get_cache_invalidating_env_vars())
        name = f"{source.name[:150]}.json"
        group = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest()).get_group(name)
        return bool(group) and name in group
    except Exception as error:  # noqa: BLE001 - not knowing means compiling it in a worker
        _LOG.debug("Triton cache lookup failed: %s", error)
        return False


def _job_of(fn, signature, device, constexprs, options, attrs) -> CompileJob | None:
    """The job compiling this variant in a worker, or None when a worker could not find the kernel
    (not a module-level attribute of its module)."""
    name = getattr(getattr(fn, "fn", None), "__name__", None)
    module = sys.modules.get(getattr(fn, "module", "") or "")
    if name is None or module is None or getattr(module, name, None) is not fn:
        return None
    target = fn.device_caches[device][2]
    return CompileJob(fn.module, name, dict(signature), dict(constexprs), dict(attrs), dict(options.__dict__), target)
