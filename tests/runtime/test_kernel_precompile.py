"""The load's Triton precompile (`helios.runtime.loading.kernel_precompile`): the dry run's launch
interception on a stand-in kernel class, and a real Helios kernel compiled for an H200 (sm_90) in a
spawned worker, which needs no device."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import types
from unittest import mock
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from helios.runtime.loading import kernel_precompile
from helios.runtime.loading.kernel_precompile import CompileJob, KernelCompiler, default_compile_workers

TARGET = object()  # what a device's Triton backend calls its target; the stand-in passes it through


class _Options:
    def __init__(self, **values):
        self.__dict__.update(values)


class StandInJit:
    """Triton's JITFunction where the dry run touches it: `run` compiles a variant not in its cache
    through `_do_compile` and returns None (no launch) when that does; otherwise it launches."""

    def __init__(self, name: str):
        self.fn = types.SimpleNamespace(__name__=name)
        self.module = __name__
        self.device_caches = {0: ({}, {}, TARGET, None, None)}
        self.launches: list[tuple] = []
        self.compiled: list[str] = []
        self.looked_up = 0  # launches that reached `run`

    def run(self, *args, grid, warmup, **kwargs):
        self.looked_up += 1
        key = kwargs.get("BLOCK", 0)
        kernel = self.device_caches[0][0].get(key)
        if kernel is None:
            kernel = self._do_compile(key, {"x": "*fp32", "BLOCK": "constexpr"}, 0, {(1,): key}, _Options(num_warps=4),
                                      {(0,): [["tt.divisibility", 16]]}, warmup)
            if kernel is None:
                return None
        if not warmup:
            self.launches.append((threading.get_ident(), key))
        return kernel

    def _do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        self.compiled.append(key)
        self.device_caches[0][0][key] = f"kernel {key}"
        return self.device_caches[0][0][key]


stand_in_kernel = StandInJit("stand_in_kernel")


@pytest.fixture
def kernel(monkeypatch):
    stand_in_kernel.__init__("stand_in_kernel")
    # the stand-in's cache key, as `_launch_key` computes Triton's (tested on a real kernel below)
    monkeypatch.setattr(kernel_precompile, "_launch_key", lambda fn, args, kwargs: kwargs.get("BLOCK", 0))
    return stand_in_kernel


def _launch(kernel, *tensors, block=16):
    return StandInJit.run(kernel, *tensors, grid=(1,), warmup=False, BLOCK=block)


def test_dry_run_sends_each_variant_once_skips_its_launch_and_zeroes_only_intermediates(kernel):
    executor = ThreadPoolExecutor(1)
    sent: list[CompileJob] = []
    compiler = KernelCompiler(1, executor=executor)
    compiler.submit = lambda job, key, submit=compiler.submit: sent.append(job) or submit(job, key)
    weight, intermediate = torch.ones(4), torch.ones(4)
    view = intermediate[1:]  # a view of an intermediate: its storage is not an argument's
    with kernel_precompile._patched(StandInJit, compiler, threading.get_ident(),
                                    {weight.untyped_storage().data_ptr()}):
        assert _launch(kernel, weight, view) is None
        intermediate.fill_(1.0)
        assert _launch(kernel, weight, view) is None  # still not compiled here: skipped, not sent again
    assert kernel.launches == [] and kernel.compiled == []
    assert kernel.looked_up == 1  # the second launch was known sent from its key: `run` never entered
    assert compiler.skipped_launches == 2
    assert [job.kernel for job in sent] == [f"{__name__}.stand_in_kernel"]  # the second launch sends nothing
    assert len(compiler._jobs) == 1  # one job per variant
    job = sent[0]
    assert job.constexprs == {(1,): 16} and job.options == {"num_warps": 4} and job.target is TARGET
    assert torch.equal(weight, torch.ones(4))
    assert torch.equal(intermediate, torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # restored: outside the dry run the variant compiles and launches here
    assert _launch(kernel, weight) == "kernel 16" and kernel.launches == [(threading.get_ident(), 16)]
    executor.shutdown()


def test_a_plans_dry_run_never_zeroes_the_tensors_its_graph_modules_hold(kernel, monkeypatch):
    """A graph module's own tensors (the constants `step_calls` registers as buffers, an attribute its
    graph reads) are read by every later call, the capture's too: a skipped launch given one zeroes
    only the intermediates beside it. (Zeroed, Llama 4's ``ones`` MoE combine weights stayed zero on a
    first load over an empty Triton cache.)"""
    from helios.runtime.loading.cuda_graphs import _Plan, dry_run_plan, held_tensors

    monkeypatch.setattr("triton.runtime.jit.JITFunction", StandInJit)  # what `dry_run` patches
    outputs = []

    def launch(x, combine, table):
        out = torch.full((4,), 7.0)  # the op's intermediate, written by the launch
        _launch(kernel, x, combine, table, out)
        outputs.append(out)
        return out

    root = torch.nn.Module()
    root.register_buffer("combine", torch.ones(4), persistent=False)
    root.table = torch.arange(4.0)  # a plain attribute, as an exported program's constants may be
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(launch, (x, graph.get_attr("combine"), graph.get_attr("table"))))
    module = torch.fx.GraphModule(root, graph)
    assert {id(t) for t in held_tensors(module)} == {id(module.combine), id(module.table)}
    assert held_tensors(launch) == []

    argument = torch.ones(4)
    compiler = KernelCompiler(1, executor=ThreadPoolExecutor(1))
    with compiler.dry_run([argument]):
        dry_run_plan(_Plan(None, "decode (batch 1)", (module, None), None), [argument], compiler)
    assert kernel.launches == [] and compiler.skipped_launches == 1
    assert torch.equal(module.combine, torch.ones(4)) and torch.equal(module.table, torch.arange(4.0))
    assert torch.equal(argument, torch.ones(4)) and torch.equal(outputs[0], torch.zeros(4))
    compiler.protect([outputs[0]])  # outside a dry run: nothing to protect
    assert compiler._protected is None
    compiler.close()


def test_dry_run_leaves_other_threads_and_compiled_variants_launching(kernel):
    compiler = KernelCompiler(1, executor=ThreadPoolExecutor(1))
    kernel.device_caches[0][0][32] = "kernel 32"  # compiled before the dry run
    with kernel_precompile._patched(StandInJit, compiler, threading.get_ident(), set()):
        assert _launch(kernel, block=32) == "kernel 32"
        other = threading.Thread(target=_launch, args=(kernel,), kwargs={"block": 64})
        other.start()
        other.join()
    assert [key for _, key in kernel.launches] == [32, 64] and kernel.compiled == [64]
    assert compiler._jobs == {}


def test_a_kernel_its_module_does_not_name_compiles_and_launches_here():
    nested = StandInJit("not_a_module_attribute")
    compiler = KernelCompiler(1, executor=ThreadPoolExecutor(1))
    with kernel_precompile._patched(StandInJit, compiler, threading.get_ident(), set()):
        assert _launch(nested) == "kernel 16"
    assert nested.compiled == [16] and len(nested.launches) == 1 and compiler._jobs == {}


def test_without_workers_the_dry_run_changes_nothing(kernel):
    compiler = KernelCompiler(0)
    assert not compiler.active
    with compiler.dry_run([]):
        assert _launch(kernel) == "kernel 16"
    assert compiler.wait() == {"variants": 0, "failed": [], "seconds": 0.0, "skipped_launches": 0, "compiles": []}


def test_a_job_that_fails_in_a_worker_is_reported_for_the_warm_up():
    compiler = KernelCompiler(1, executor=ThreadPoolExecutor(1))
    bad = CompileJob("helios.no_such_module", "kernel", {}, {}, {}, {}, None)
    assert compiler.submit(bad, ("bad",))
    report = compiler.wait()
    assert report["variants"] == 1 and report["failed"] == ["helios.no_such_module.kernel"]


def test_the_report_says_when_each_variant_was_sent_by_what_and_when_it_was_done():
    release = threading.Event()
    compiler = KernelCompiler(2, executor=ThreadPoolExecutor(2))
    compiler.label = "decode (batch 1)"
    slow = CompileJob("m", "slow", {}, {}, {}, {}, None)
    with mock.patch.object(kernel_precompile, "compile_job", lambda job: release.wait(5) and 0.25):
        assert compiler.submit(slow, ("slow",))
        compiler.label = "prefill (batch 1)"
        time.sleep(0.05)
        assert compiler.submit(dataclasses.replace(slow, name="late"), ("late",))
        release.set()
        report = compiler.wait()
    (slow_entry, late_entry) = sorted(report["compiles"], key=lambda c: c[2])
    assert slow_entry[:2] == ("m.slow", "decode (batch 1)") and slow_entry[2] == 0.0
    assert late_entry[:2] == ("m.late", "prefill (batch 1)") and late_entry[2] >= 0.04
    assert all(entry[3] == 0.25 and entry[4] >= entry[2] for entry in report["compiles"])
    assert report["seconds"] == 0.5


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no thread priorities here")
def test_workers_are_spawned_from_a_thread_of_lowered_priority():
    """The workers inherit the spawning thread's niceness (Linux: each thread has its own): raised by
    WORKER_NICENESS there, the load's own thread's left as it was."""
    seen = []

    class Pool:
        def submit(self, fn):
            seen.append((fn, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    spawner = threading.Thread(target=kernel_precompile._spawn_niced, args=(Pool(), 3))
    spawner.start()
    spawner.join()
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + kernel_precompile.WORKER_NICENESS)
    assert seen == [(kernel_precompile._ready, expected)] * 3


def test_a_first_load_starts_its_workers_and_tritons_key_on_threads_of_their_own(monkeypatch):
    """`start` in a process's first load: the workers (niced) and Triton's key, each on its own
    thread; the workers' pool takes the load's Triton environment."""
    pytest.importorskip("triton")
    calls, done = [], threading.Semaphore(0)

    def record(name):
        return lambda *args: (calls.append((name, threading.current_thread().name, args)), done.release())

    monkeypatch.setattr(kernel_precompile, "_COMPILED_HERE", False)
    monkeypatch.setattr(kernel_precompile, "_spawn_niced", record("workers"))
    monkeypatch.setattr(kernel_precompile, "_triton_key", record("key"))
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")
    with KernelCompiler(2) as compiler:
        compiler.start()
        for _ in range(2):
            assert done.acquire(timeout=10)
        assert compiler._pool._initargs == ({**{k: v for k, v in os.environ.items() if k.startswith("TRITON_")}},
                                            os.getpid())
        assert compiler._pool._initargs[0]["TRITON_CACHE_DIR"] == "/somewhere/else"
    assert sorted((name, thread) for name, thread, _ in calls) == [
        ("key", "helios-triton-key"), ("workers", "helios-compile-spawn")]
    assert [args for name, _, args in calls if name == "workers"][0][1] == 2


def test_a_worker_takes_the_loads_triton_environment_not_the_fork_servers(monkeypatch):
    monkeypatch.setattr(kernel_precompile, "_triton_key", lambda: None)
    monkeypatch.setattr(kernel_precompile.torch, "set_num_threads", lambda n: None)
    for name, value in list(os.environ.items()):  # restored after the test, whatever it removes
        if name.startswith("TRITON_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/the/servers")
    monkeypatch.setenv("TRITON_STALE_KNOB", "1")
    monkeypatch.setenv("TRITON_DEBUG", "1")
    monkeypatch.delenv("TRITON_DEBUG")
    monkeypatch.setenv("HELIOS_UNRELATED", "kept")
    kernel_precompile._init_worker({"TRITON_CACHE_DIR": "/the/loads", "TRITON_DEBUG": "0"})
    assert os.environ["TRITON_CACHE_DIR"] == "/the/loads" and os.environ["TRITON_DEBUG"] == "0"
    assert "TRITON_STALE_KNOB" not in os.environ and os.environ["HELIOS_UNRELATED"] == "kept"


def test_a_pool_that_cannot_start_a_worker_leaves_the_kernels_to_the_warm_up():
    """Starting a worker can fail with a connection error (the fork server ended: its preload
    raised): `submit` then says the variant was not sent, closes the pool and warns."""

    class NoServer(ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            raise EOFError("the fork server ended")

    compiler = KernelCompiler(1, executor=NoServer(1))
    assert not compiler.submit(_silu_mul_job(), ("silu",)) and not compiler.active
    kernel_precompile._spawn_niced(NoServer(1), 2)  # the spawning thread: logged, not raised


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server here")
def test_a_fork_server_whose_preload_raises_fails_no_load(tmp_path: Path):
    """A real fork server that ends in its preload (in a fresh process, as a main module that raises
    when run again would): the load's spawning thread and its `submit` both carry on without workers."""
    pytest.importorskip("triton")
    (tmp_path / "raises_on_import.py").write_text('raise ValueError("not importable twice")\n')
    code = """
import logging, sys, threading
from helios.runtime.loading import kernel_precompile
kernel_precompile.WORKER_PRELOAD += ("raises_on_import",)
kernel_precompile._COMPILED_HERE = False
with kernel_precompile.KernelCompiler(2) as compiler:
    compiler.start()
    for spawning in [t for t in threading.enumerate() if t.name == "helios-compile-spawn"]:
        spawning.join(60)  # the spawning thread meets the ended server first
    sent = compiler.submit(kernel_precompile.CompileJob("m", "k", {}, {}, {}, {}, None), ("k",))
print("sent", sent, "active", compiler.active)
"""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    run = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "sent False active False" in run.stdout
    assert "not importable twice" in run.stderr  # the server's own traceback
    assert "Triton compile workers unavailable" in run.stderr


def test_workers_come_from_the_fork_server_where_there_is_one():
    context = kernel_precompile._worker_context()
    if "forkserver" in multiprocessing.get_all_start_methods():
        assert context.get_start_method() == "forkserver"
        from multiprocessing import forkserver

        assert forkserver._forkserver._preload_modules == list(kernel_precompile.WORKER_PRELOAD)
    else:
        assert context.get_start_method() == "spawn"


def test_tritons_key_of_itself_is_computed_ahead_in_the_load_and_in_each_worker(monkeypatch):
    cache = pytest.importorskip("triton.runtime.cache")
    calls = []
    monkeypatch.setattr(cache, "triton_key", lambda: calls.append("key") or "key")
    monkeypatch.setattr(kernel_precompile.torch, "set_num_threads", lambda n: calls.append(n))
    kernel_precompile._init_worker()
    assert calls == [1, "key"]
    kernel_precompile._triton_key()
    assert calls == [1, "key", "key"]

    def broken():
        raise RuntimeError("no libtriton here")
    monkeypatch.setattr(cache, "triton_key", broken)
    kernel_precompile._triton_key()  # best effort: the first compile computes it, or raises, itself


def test_default_workers_leave_a_cpu_for_the_load(monkeypatch):
    monkeypatch.setattr(kernel_precompile.os, "sched_getaffinity", lambda _: set(range(2)), raising=False)
    assert default_compile_workers() == 0
    monkeypatch.setattr(kernel_precompile.os, "sched_getaffinity", lambda _: set(range(16)), raising=False)
    assert default_compile_workers() == kernel_precompile.MAX_WORKERS


class _Pointer:
    """What Triton's binder reads of a tensor argument: its address and element type."""

    def __init__(self, address: int, dtype: torch.dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


def _silu_mul_job() -> CompileJob:
    """The job `_do_compile` would send for `triton_fused._silu_mul_kernel` at 8B shapes on an H200:
    bound and packed as `JITFunction.run` does, for the sm_90 target, without a device."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    from triton.runtime.jit import JITFunction

    from helios.abi.triton_fused import _silu_mul_kernel as kernel

    # where an earlier test in this process turned Triton's interpreter on, the module holds an
    # interpreted kernel: the compiler's view of the same function binds the arguments
    fn = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    args = (_Pointer(1 << 20, torch.bfloat16), 28672, _Pointer(2 << 20, torch.bfloat16), 14336)
    kwargs = {"BLOCK": 1024, "num_warps": 4, "debug": False, "instrumentation_mode": ""}
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    assert triton is not None
    return CompileJob("helios.abi.triton_fused", "_silu_mul_kernel", signature, constexprs, attrs,
                      dict(options.__dict__), target)


def test_the_launch_key_is_the_one_tritons_run_looks_up(monkeypatch):
    """`_launch_key` (how the dry run knows a launch's variant was sent without `run`'s packing) follows
    `JITFunction.run` to the key it looks the variant up by and compiles it under: a real Helios
    kernel bound for sm_90 without a device, launches that differ in a constexpr and in how an
    integer specializes (divisible by 16, 1, neither)."""
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from helios.abi.triton_fused import _silu_mul_kernel as kernel

    fn = JITFunction(kernel.fn)  # a kernel object of its own: its caches are this test's
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    fn.device_caches[0] = ({}, {}, target, backend, create_function_from_signature(fn.signature, fn.params, backend))
    monkeypatch.setattr(driver, "_active", types.SimpleNamespace(get_current_device=lambda: 0,
                                                                  get_current_stream=lambda device: 0))
    looked_up: list = []
    fn._do_compile = lambda key, *rest: looked_up.append(key)  # None: `run` launches nothing
    computed = []
    for block, rows in ((1024, 28672), (1024, 1), (1024, 28673), (512, 28672)):
        args = (_Pointer(1 << 20, torch.bfloat16), rows, _Pointer(2 << 20, torch.bfloat16), 14336)
        assert fn.run(*args, grid=(1,), warmup=False, BLOCK=block, num_warps=4) is None
        computed.append(kernel_precompile._launch_key(fn, args, {"BLOCK": block, "num_warps": 4}))
    assert computed == looked_up and len(set(computed)) == 4


def test_a_helios_kernel_compiles_for_sm90_in_a_spawned_worker_into_tritons_disk_cache(tmp_path: Path, monkeypatch):
    """The compiled variant is where `triton.compile` would look: `cached_on_disk` finds it (so the
    dry run loads and launches it instead of sending it to a worker), and only that variant."""
    job = _silu_mul_job()
    assert job.signature["gate_up"] == "*bf16" and job.constexprs
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # the spawned worker inherits it
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # its kernels: compiled, not interpreted
    assert not kernel_precompile.cached_on_disk(job)
    with KernelCompiler(1) as compiler:
        assert not compiler.active and not compiler.submit(job, ("silu",))  # not started: no workers yet
        compiler.start()
        assert compiler.submit(job, ("silu",))
        report = compiler.wait()
    assert report["variants"] == 1 and report["failed"] == [] and report["seconds"] > 0
    cubins = list(tmp_path.rglob("_silu_mul_kernel.cubin"))
    assert len(cubins) == 1 and cubins[0].stat().st_size > 0
    assert kernel_precompile.cached_on_disk(job)
    other = dataclasses.replace(job, constexprs={**job.constexprs, next(iter(job.constexprs)): 512})
    assert not kernel_precompile.cached_on_disk(other)


class _BrokenPool(ThreadPoolExecutor):
    def submit(self, *args, **kwargs):
        from concurrent.futures.process import BrokenProcessPool

        raise BrokenProcessPool("a worker was killed")


def test_a_broken_pool_leaves_the_kernels_to_compile_and_launch_here(kernel):
    compiler = KernelCompiler(1, executor=_BrokenPool(1))
    with kernel_precompile._patched(StandInJit, compiler, threading.get_ident(), set()):
        assert _launch(kernel) == "kernel 16"
        assert _launch(kernel, block=32) == "kernel 32"
    assert kernel.compiled == [16, 32] and len(kernel.launches) == 2
    assert not compiler.active and compiler.wait()["variants"] == 0


def test_a_variant_already_on_disk_is_loaded_and_launched_here(kernel, monkeypatch):
    monkeypatch.setattr(kernel_precompile, "cached_on_disk", lambda job: True)
    compiler = KernelCompiler(1, executor=ThreadPoolExecutor(1))
    with kernel_precompile._patched(StandInJit, compiler, threading.get_ident(), set()):
        assert _launch(kernel) == "kernel 16"
    assert kernel.compiled == [16] and len(kernel.launches) == 1 and compiler._jobs == {}


def test_workers_asked_for_are_at_most_the_cpus(monkeypatch):
    monkeypatch.setattr(kernel_precompile.os, "sched_getaffinity", lambda _: set(range(4)), raising=False)
    assert KernelCompiler(100_000).workers == 4 and KernelCompiler(2).workers == 2


def _jobs_in_start_order(longest_first: bool, kernels: list[str]) -> list[str]:
    """The kernels of `kernels`, sent in that order to one worker kept busy by the first until all
    are sent, in the order the worker started compiling them."""
    started, release = [], threading.Event()

    def compiling(job):
        started.append(job.kernel)
        release.wait(5)
        return 0.01

    compiler = KernelCompiler(1, executor=ThreadPoolExecutor(1), longest_first=longest_first)
    with mock.patch.object(kernel_precompile, "compile_job", compiling):
        for index, kernel in enumerate(kernels):
            module, name = kernel.rsplit(".", 1)
            assert compiler.submit(CompileJob(module, name, {}, {}, {}, {}, None), (kernel, index))
        release.set()
        report = compiler.wait()
    assert report["variants"] == len(kernels) and report["failed"] == []
    return started


def test_longest_first_gives_a_free_worker_the_waiting_variant_expected_to_compile_longest():
    prefill, decode = "helios.abi.triton_prefill._prefill_kernel", "helios.abi.triton_decode._decode_kernel"
    assert kernel_precompile.expected_seconds(CompileJob(*prefill.rsplit(".", 1), {}, {}, {}, {}, None)) > \
        kernel_precompile.expected_seconds(CompileJob(*decode.rsplit(".", 1), {}, {}, {}, {}, None)) > \
        kernel_precompile.expected_seconds(CompileJob("m", "short", {}, {}, {}, {}, None))
    sent = ["m.first", "m.short", decode, "m.other", prefill, "m.last"]
    # The first goes to the free worker at once; the rest wait, the longest first, equals in sent order.
    assert _jobs_in_start_order(True, sent) == ["m.first", prefill, decode, "m.short", "m.other", "m.last"]
    assert _jobs_in_start_order(False, sent) == sent  # without it: the order they were sent
    from helios.runtime.loading.model import LoadOptions

    assert KernelCompiler(1).longest_first and LoadOptions().compile_longest_first  # the default


def test_longest_first_keeps_one_variant_a_worker_and_every_worker_busy(monkeypatch):
    monkeypatch.setattr(kernel_precompile, "_cpus", lambda: 8)  # three workers on any machine
    running, most, lock = [0], [0], threading.Lock()
    together = threading.Barrier(3)  # the first three compile at once (a worker left idle would time it out)

    def compiling(job):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            if job.name in ("k0", "k1", "k2"):
                together.wait(timeout=5)
            time.sleep(0.01)
        finally:
            with lock:
                running[0] -= 1
        return 0.02

    compiler = KernelCompiler(3, executor=ThreadPoolExecutor(8), longest_first=True)
    with mock.patch.object(kernel_precompile, "compile_job", compiling):
        for index in range(12):
            assert compiler.submit(CompileJob("m", f"k{index}", {}, {}, {}, {}, None), (index,))
        report = compiler.wait()
    assert most[0] == 3  # never more than one a worker, though the executor has threads for eight
    assert report["variants"] == 12 and report["failed"] == [] and report["seconds"] == pytest.approx(0.24)


def test_a_pool_that_breaks_while_variants_wait_leaves_them_to_the_warm_up():
    """Sending a waiting variant to a pool that broke meanwhile fails it and every other waiting one
    (`wait` reports them; the warm-up runs compile them) and closes the pool."""
    release = threading.Event()

    class BreaksAfterOne(ThreadPoolExecutor):
        calls = 0

        def submit(self, fn, *args, **kwargs):
            BreaksAfterOne.calls += 1
            if BreaksAfterOne.calls > 1:
                raise RuntimeError("cannot schedule new futures after shutdown")
            return super().submit(fn, *args, **kwargs)

    compiler = KernelCompiler(1, executor=BreaksAfterOne(1), longest_first=True)
    with mock.patch.object(kernel_precompile, "compile_job", lambda job: release.wait(5) and 0.01):
        for name in ("first", "second", "third"):
            assert compiler.submit(CompileJob("m", name, {}, {}, {}, {}, None), (name,))
        release.set()
        report = compiler.wait()
    assert sorted(report["failed"]) == ["m.second", "m.third"] and not compiler.active
    assert not compiler.submit(CompileJob("m", "fourth", {}, {}, {}, {}, None), ("fourth",))  # closed: compiled here


def test_closing_the_compiler_ends_the_variants_still_waiting():
    release = threading.Event()
    compiler = KernelCompiler(1, executor=ThreadPoolExecutor(1), longest_first=True)
    with mock.patch.object(kernel_precompile, "compile_job", lambda job: release.wait(5) and 0.01):
        for name in ("first", "second"):
            assert compiler.submit(CompileJob("m", name, {}, {}, {}, {}, None), (name,))
        compiler.close()
        release.set()
        waiting = compiler._jobs[("second",)]
        assert isinstance(waiting.exception(timeout=5), kernel_precompile.CancelledError)


@pytest.mark.parametrize("longest_first", [False, True])
def test_the_load_option_reaches_the_compiler(monkeypatch, longest_first):
    from helios.runtime.loading import model
    from runtime.test_model_fixture import open_fixture

    made = []

    class Recorded(KernelCompiler):
        def __init__(self, workers, executor=None, longest_first=True):
            made.append(longest_first)
            super().__init__(workers, executor, longest_first)

    monkeypatch.setattr(model, "KernelCompiler", Recorded)
    assert model.load_model(open_fixture(), model.LoadOptions(compile_longest_first=longest_first)).programs
    assert made == [longest_first]


OWNER = """
import os, sys
from helios.runtime.loading.kernel_precompile import KernelCompiler

compiler = KernelCompiler(2)
compiler.start()
pids = {compiler._pool.submit(os.getpid).result(timeout=240) for _ in range(8)}
print(" ".join(map(str, sorted(pids))), flush=True)
sys.stdin.read()  # until killed
"""


def test_compile_workers_end_when_their_loading_process_is_killed():
    """A loading process killed mid-load (an engine process stopped while it loads) never shuts its pool
    down: its workers, children of the fork server, waited on their queue for good."""
    pytest.importorskip("triton")
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in owner.stdout.readline().split()]
        assert workers and all(_alive(pid) for pid in workers)
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 60  # a bound on the wait, not a timing assertion: they poll every 0.5 s
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not reaped yet, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
