"""HTTP admission: permits are bounded, released once, and preparation slots bound concurrency."""

from __future__ import annotations

import asyncio

import pytest

from helios.server.admission import AdmissionController, AdmissionLimits, IngressFull


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
    controller = AdmissionController(AdmissionLimits(max_active=8, queue_capacity=8, frontend_workers=2))
    running = 0
    peak = 0

    async def prepare():
        nonlocal running, peak
        async with controller.preparation_slot():
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1

    async def main():
        await asyncio.gather(*(prepare() for _ in range(6)))

    asyncio.run(main())
    assert peak == 2
