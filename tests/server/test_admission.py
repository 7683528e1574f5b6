"""HTTP admission: permits are bounded, released once, and preparation slots bound concurrency."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from helios.server.admission import AdmissionController, AdmissionLimits, IngressFull
from helios.server.preparation import PreparationGate, PreparationPool, PreparationTimeout


def test_permits_are_bounded_by_queue_plus_active():
    controller = AdmissionController(AdmissionLimits(max_active=2, queue_capacity=1, frontend_workers=1))
    permits = [controller.acquire() for _ in range(3)]
    with pytest.raises(IngressFull) as caught:
        controller.acquire()
    assert caught.value.http_status == 429
    permits[0].release()
    permits[0].release()  # idempotent: a second release frees nothing more
    assert controller.in_use == 2
    controller.acquire()
    with pytest.raises(IngressFull):
        controller.acquire()


def test_preparation_slots_bound_concurrency():
    gate = PreparationGate(PreparationPool(2), frontend_workers=2)
    running = 0
    peak = 0
    lock = threading.Lock()

    def prepare():
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.01)
        with lock:
            running -= 1

    async def main():
        await asyncio.gather(*(gate.run(prepare, compiles=False) for _ in range(6)))

    asyncio.run(main())
    gate.close()
    assert peak == 2


def test_grammar_compiles_never_hold_every_preparation_slot():
    """Two slow compiles with two slots: one slot stays free for plain requests."""
    gate = PreparationGate(PreparationPool(3), frontend_workers=2)
    release = threading.Event()

    async def main():
        compiles = [asyncio.ensure_future(gate.run(release.wait, 5, compiles=True)) for _ in range(2)]
        await asyncio.sleep(0.05)
        plain = await asyncio.wait_for(gate.run(lambda: "plain", compiles=False), 2)
        release.set()
        await asyncio.gather(*compiles)
        return plain

    assert asyncio.run(main()) == "plain"
    gate.close()


def test_a_preparation_past_the_time_bound_fails_and_keeps_its_slot_until_it_ends():
    gate = PreparationGate(PreparationPool(2), frontend_workers=1, timeout_s=0.05)
    release = threading.Event()

    async def main():
        with pytest.raises(PreparationTimeout):
            await gate.run(release.wait, 5, compiles=False)
        waiting = asyncio.ensure_future(gate.run(lambda: "next", compiles=False))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # the timed-out call still runs and holds the only slot
        release.set()
        return await asyncio.wait_for(waiting, 2)

    assert asyncio.run(main()) == "next"
    assert PreparationTimeout.http_status == 400
    gate.close()


def test_a_request_cancelled_while_preparing_keeps_its_slots_until_the_preparation_ends():
    """The waiting request goes away (its client disconnected) while its compile runs in the pool: the
    thread cannot be stopped, so its compile and preparation slots stay held until it ends (released
    at the cancellation, one more compile ran than the limit allows)."""
    gate = PreparationGate(PreparationPool(3), frontend_workers=2)  # one compile slot
    started, release = threading.Event(), threading.Event()
    lock, running, peak = threading.Lock(), 0, 0

    def compile_grammar(first: bool):
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        if first:
            started.set()
            release.wait(5)
        with lock:
            running -= 1
        return "compiled"

    async def main():
        first = asyncio.ensure_future(gate.run(compile_grammar, True, compiles=True))
        await asyncio.to_thread(started.wait, 5)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        second = asyncio.ensure_future(gate.run(compile_grammar, False, compiles=True))
        await asyncio.wait({second}, timeout=0.2)  # admitted at once where the slot was freed early
        release.set()
        return await asyncio.wait_for(second, 2)

    assert asyncio.run(main()) == "compiled"
    assert peak == 1
    gate.close()


def test_preparation_errors_reach_the_request():
    gate = PreparationGate(PreparationPool(1), frontend_workers=1)

    def failing():
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        asyncio.run(gate.run(failing, compiles=False))
    gate.close()


def test_a_preparation_raising_stopiteration_fails_its_request_at_once_and_frees_its_slot():
    """An asyncio future refuses StopIteration (a bare next() on an empty iterator in preparation
    code): the request waited for the time bound, failed as a slow grammar, and the slot leaked."""
    gate = PreparationGate(PreparationPool(1), frontend_workers=1, timeout_s=30)

    async def main():
        with pytest.raises(RuntimeError, match="StopIteration") as raised:
            await asyncio.wait_for(gate.run(lambda: next(iter(())), compiles=False), 10)
        assert isinstance(raised.value.__cause__, StopIteration)
        return await asyncio.wait_for(gate.run(lambda: "next", compiles=False), 10)

    assert asyncio.run(main()) == "next"
    gate.close()

