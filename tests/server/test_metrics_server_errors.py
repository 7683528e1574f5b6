"""A request the application raises for (an unexpected fault, answered 500 by the server's error
handler, which sits outside every middleware) is counted in ``helios_http_responses_total`` as 500,
as the access log writes it. It went uncounted: the 500s operators alert on were missing."""

from __future__ import annotations

import asyncio
import logging

import httpx

from support.server_core import assert_serving, chat_body


def count(served, endpoint: str, status: str) -> float:
    value = served.metrics.registry.get_sample_value("helios_http_responses_total",
                                                     {"endpoint": endpoint, "status": status})
    return value or 0.0


def post(app, path: str, body: dict) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post(path, json=body)

    return asyncio.run(scenario())


def test_an_unexpected_fault_is_counted_as_a_500_response(app, served, monkeypatch, caplog):
    async def faulty(*_args, **_kwargs):
        raise RuntimeError("a fault no handler knows")

    before = count(served, "chat", "500")
    with monkeypatch.context() as patched:
        patched.setattr(served, "respond", faulty)
        with caplog.at_level(logging.INFO, logger="helios.access"):
            response = post(app, "/v1/chat/completions", chat_body(max_tokens=1))
    assert response.status_code == 500
    assert response.json()["error"] == {"message": "internal error: RuntimeError", "type": "execution_error",
                                        "param": None, "code": 500}
    assert count(served, "chat", "500") == before + 1
    assert [record.getMessage().split('" ')[1].split()[0] for record in caplog.records
            if record.name == "helios.access"] == ["500"]
    assert_serving(app, served)


def test_an_answered_request_is_counted_once(app, served):
    before = count(served, "chat", "200")
    assert post(app, "/v1/chat/completions", chat_body(max_tokens=1)).status_code == 200
    assert count(served, "chat", "200") == before + 1
