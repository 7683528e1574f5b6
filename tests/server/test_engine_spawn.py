"""`helios serve`'s engine process started ahead of its load order (`helios.server.engine_spawn`):
it runs its order after the imports of a load on its device, stops at the end of the pipe or when
discarded, and a discard after the order leaves it to its owner. The processes run
`support.spawn_probe` for a main, not a load; `helios serve`'s own use is
tests/e2e/test_lifecycle_faults.py's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from helios.server.engine_process import CPU_LOAD_IMPORTS, LOAD_IMPORTS, ahead_imports
from helios.server.engine_spawn import ArgsOrder, EngineOrder, spawn_engine_process
from support.spawn_probe import AHEAD, order_of, refused_order, report_order

JOIN_S = 60  # a spawned Python's start on a crowded machine


def test_an_ordered_process_runs_its_order_after_a_cpu_loads_imports_with_the_orphan_watch_on():
    spawned = spawn_engine_process(report_order, device="cpu")
    spawned.order(EngineOrder("model.core", {"queue_capacity": 4}, 3))
    assert spawned.connection.poll(JOIN_S)
    assert spawned.connection.recv() == ("model.core", {"queue_capacity": 4}, 3, False, list(AHEAD))
    spawned.discard()  # ordered: the process is the owner's, and ends by itself here
    spawned.process.join(JOIN_S)
    assert spawned.process.exitcode == 0


def test_only_a_cpu_load_imports_torchs_deserializer_ahead():
    """It pulls in torch._dynamo, which a CUDA load never imports."""
    assert ahead_imports("cpu") == ahead_imports(" cpu:0") == LOAD_IMPORTS + CPU_LOAD_IMPORTS
    assert ahead_imports("cuda") == ahead_imports("cuda:1") == LOAD_IMPORTS
    assert "torch._export.serde.serialize" in CPU_LOAD_IMPORTS


def test_a_discarded_process_is_killed_and_a_closed_pipe_ends_one_quietly():
    discarded = spawn_engine_process(report_order)
    discarded.discard()
    discarded.discard()  # idempotent
    assert discarded.process.exitcode == -signal.SIGKILL and discarded.connection.closed
    abandoned = spawn_engine_process(report_order)
    abandoned.connection.close()  # a serving process that stopped without an order or a kill
    abandoned.process.join(JOIN_S)
    assert abandoned.process.exitcode == 0


def test_a_process_spawned_without_a_device_imports_nothing_ahead():
    spawned = spawn_engine_process(report_order)
    spawned.order(EngineOrder("model.core", None))
    assert spawned.connection.poll(JOIN_S)
    assert spawned.connection.recv() == ("model.core", None, None, False, [])
    spawned.process.join(JOIN_S)


def test_an_order_sent_ahead_is_made_in_the_engine_process_and_a_discard_still_stops_it():
    """A core file's order goes as its command line before the serving process's imports (`order_ahead`):
    the engine process makes it itself; until taken over, a failed start's discard kills it, loading or not."""
    spawned = spawn_engine_process(report_order, device="cpu")
    spawned.order_ahead(ArgsOrder(order_of, {"core": "model.core", "threads": 2}))
    assert spawned.connection.poll(JOIN_S)
    assert spawned.connection.recv() == ("model.core", {"made in": "the engine process"}, 2, False, list(AHEAD))
    assert spawned.ordered_ahead and not spawned.ordered
    spawned.discard()
    assert spawned.process.exitcode in (0, -signal.SIGKILL)  # it may have ended by itself after its report
    loading = spawn_engine_process(report_order)
    loading.order_ahead(ArgsOrder(order_of, {"core": "model.core"}))
    loading.take()
    loading.discard()  # taken over: its owner's to stop
    assert loading.connection.poll(JOIN_S) and loading.connection.recv()[0] == "model.core"
    loading.process.join(JOIN_S)
    assert loading.process.exitcode == 0


def test_an_order_the_engine_process_cannot_make_is_reported_typed():
    from helios.errors import UsageError
    from helios.server.engine_process import _Failed

    spawned = spawn_engine_process(report_order)
    spawned.order_ahead(ArgsOrder(refused_order, {"flag": "max-active"}))
    assert spawned.connection.poll(JOIN_S)
    failed = spawned.connection.recv()
    assert isinstance(failed, _Failed) and isinstance(failed.error, UsageError)
    assert str(failed.error) == "--max-active is refused"
    spawned.process.join(JOIN_S)
    assert spawned.process.exitcode == 0


def test_a_discard_stops_an_order_sent_ahead_while_it_waits_for_its_imports():
    spawned = spawn_engine_process(report_order, device="cpu")
    spawned.order_ahead(ArgsOrder(order_of, {"core": "model.core"}))
    spawned.discard()
    assert spawned.process.exitcode == -signal.SIGKILL and spawned.connection.closed


def test_the_engine_process_imports_no_sympy_before_a_load_on_the_cpu_asks_for_it():
    """Symbolic shapes (sympy) serve only CPU programs (`cpu_fast`, `program_compile`), and were 2 s of a
    CUDA engine process's 6 s of imports on an H100's host; a CPU load imports them ahead (`ahead_imports`)."""
    program = ("import sys, helios.server.engine_process; "
               "print([m for m in ('sympy', 'torch.fx.experimental.symbolic_shapes') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=JOIN_S)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
    assert "sympy.tensor.tensor" in CPU_LOAD_IMPORTS


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (Linux: its SigCgt mask)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def test_a_hangup_of_the_process_group_leaves_the_engine_process_to_its_serving_process():
    """A closed terminal hangs up the whole process group. The serving process drains on SIGHUP as on
    SIGTERM, but the engine process died of it at once, so every running response ended with "the
    model worker died" instead of finishing within the drain (SIGTERM and SIGINT were ignored already)."""
    import time

    spawned = spawn_engine_process(report_order)
    deadline = time.monotonic() + JOIN_S
    while not _catches(spawned.process.pid, signal.SIGUSR1):  # its entry's signal settings are made
        assert spawned.process.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(spawned.process.pid, signal.SIGHUP)
    spawned.order(EngineOrder("model.core", None))
    assert spawned.connection.poll(JOIN_S), f"the engine process ended: {spawned.process.exitcode}"
    assert spawned.connection.recv()[0] == "model.core"
    spawned.process.join(JOIN_S)
    assert spawned.process.exitcode == 0
