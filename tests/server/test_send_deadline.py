"""The send deadline of a response: a send the client does not take within the timeout raises
`SendTimeout`; sends that complete never time out however many there are or however long the
response lasts; a cancellation from outside stays a cancellation; one timer serves every send."""

from __future__ import annotations

import asyncio

import pytest

from helios.server.responses import SendDeadline, SendTimeout


class Client:
    """An ASGI send whose writes block until `unstuck` is set."""

    def __init__(self):
        self.messages = []
        self.unstuck = asyncio.Event()
        self.unstuck.set()

    async def send(self, message) -> None:
        await self.unstuck.wait()
        self.messages.append(message)


def test_a_stuck_send_times_out_and_completed_sends_never_do():
    async def scenario():
        client = Client()
        deadline = SendDeadline(client.send, 0.05)
        for k in range(20):  # 20 sends over 0.2 s, four timeouts long: none is late
            await deadline({"k": k})
            await asyncio.sleep(0.01)
        client.unstuck.clear()
        started = asyncio.get_running_loop().time()
        with pytest.raises(SendTimeout):
            await deadline({"k": "stuck"})
        waited = asyncio.get_running_loop().time() - started
        deadline.close()
        return client.messages, waited

    messages, waited = asyncio.run(scenario())
    assert [m["k"] for m in messages] == list(range(20))
    assert 0.04 <= waited < 1.0


def test_a_pause_shorter_than_the_timeout_loses_nothing():
    async def scenario():
        client = Client()
        deadline = SendDeadline(client.send, 0.2)
        client.unstuck.clear()
        asyncio.get_running_loop().call_later(0.05, client.unstuck.set)
        await deadline({"k": 1})
        await deadline({"k": 2})
        deadline.close()
        return client.messages

    assert [m["k"] for m in asyncio.run(scenario())] == [1, 2]


def test_an_outside_cancellation_is_not_a_timeout():
    async def scenario():
        client = Client()
        deadline = SendDeadline(client.send, 10.0)
        client.unstuck.clear()
        task = asyncio.ensure_future(deadline({"k": 1}))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline.close()

    asyncio.run(scenario())


def test_one_timer_serves_many_sends():
    async def scenario():
        loop = asyncio.get_running_loop()
        armed = []
        call_at = loop.call_at

        def counting_call_at(when, callback, *args):
            armed.append(when)
            return call_at(when, callback, *args)

        loop.call_at = counting_call_at
        client = Client()
        deadline = SendDeadline(client.send, 60.0)
        for k in range(100):
            await deadline({"k": k})
        deadline.close()
        return armed

    assert len(asyncio.run(scenario())) == 1
