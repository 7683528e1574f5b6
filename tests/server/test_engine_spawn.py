"""`helios serve`'s engine process started ahead of its load order (`helios.server.engine_spawn`):
it runs its order, stops at the end of the pipe or when discarded, and a discard after the order
leaves it to its owner. The processes here run `support.spawn_probe` for a main, so none imports
torch; `helios serve`'s own use is tests/e2e/test_lifecycle_faults.py's."""

from __future__ import annotations

import signal

from helios.server.engine_spawn import EngineOrder, spawn_engine_process
from support.spawn_probe import report_order

JOIN_S = 60  # a spawned Python's start on a crowded machine


def test_an_ordered_process_runs_its_order_with_the_orphan_watch_still_on():
    spawned = spawn_engine_process(report_order)
    spawned.order(EngineOrder("model.core", {"queue_capacity": 4}, 3))
    assert spawned.connection.poll(JOIN_S)
    assert spawned.connection.recv() == ("model.core", {"queue_capacity": 4}, 3, False, False)
    spawned.discard()  # ordered: the process is the owner's, and ends by itself here
    spawned.process.join(JOIN_S)
    assert spawned.process.exitcode == 0


def test_a_discarded_process_is_killed_and_a_closed_pipe_ends_one_quietly():
    discarded = spawn_engine_process(report_order)
    discarded.discard()
    discarded.discard()  # idempotent
    assert discarded.process.exitcode == -signal.SIGKILL and discarded.connection.closed
    abandoned = spawn_engine_process(report_order)
    abandoned.connection.close()  # a serving process that stopped without an order or a kill
    abandoned.process.join(JOIN_S)
    assert abandoned.process.exitcode == 0
