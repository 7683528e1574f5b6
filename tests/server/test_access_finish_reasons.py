"""The access line's ``finish=`` says what the client saw (`helios.server.access`).

It wrote the engine's reason names: a response that ended on an end-of-sequence token said
``finish_reason: "stop"`` to its client and ``finish=eos`` in the log, so an operator matching log
lines to client reports (or grepping for ``finish=stop``) missed every such response. The metrics'
``helios_requests_finished{reason}`` keeps the engine's names (it is documented so).
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from helios.server.access import access_line
from helios.server.request_metrics import RequestRecord
from support.server_core import SERVED_ID


async def _post(app, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as client:
        return await client.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_ended_by_its_eos_token_is_logged_as_the_stop_its_client_saw(runner, served, app, caplog, stream):
    eos = sorted(served.runtime.model.settings.eos_token_ids)[0]
    caplog.set_level(logging.INFO, logger="helios.access")
    body = {"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "logit_bias": {str(eos): 100}, "stream": stream}  # the first token is the end of sequence
    response = runner.run(_post(app, body))
    assert response.status_code == 200, response.text
    assert '"finish_reason":"stop"' in response.text.replace(" ", "")
    lines = [r.getMessage() for r in caplog.records if r.name == "helios.access" and "/v1/chat" in r.getMessage()]
    assert len(lines) == 1 and "finish=stop" in lines[0] and "finish=eos" not in lines[0], lines
    assert served.stats().requests_finished.get("eos", 0) >= 1  # the metrics keep the engine's name


@pytest.mark.parametrize("reason", ["length", "stop", "cancelled", "error", "grammar_dead_end", "grammar_limit"])
def test_other_reasons_are_written_as_they_are(reason):
    record = RequestRecord.now()
    record.num_prompt_tokens, record.num_output_tokens, record.finish_reason = 3, 1, reason
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "client": ("10.0.0.1", 5)}
    assert f"finish={reason} " in access_line(scope, 200, record)


WEATHER = {"type": "function", "function": {  # a short call: a random model writes it well within the context
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}},
                                          "required": ["city"], "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_that_ended_in_a_tool_call_is_logged_as_tool_calls(runner, served, app, caplog, stream):
    """The client saw ``finish_reason: "tool_calls"``; the line said ``finish=stop`` (the record held
    only the engine's ``eos``). The metrics keep the engine's name."""
    caplog.set_level(logging.INFO, logger="helios.access")
    finished = served.stats().requests_finished.get("eos", 0)
    body = {"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "seed": 1, "stream": stream}
    response = runner.run(_post(app, body))
    assert response.status_code == 200, response.text
    assert '"finish_reason":"tool_calls"' in response.text.replace(" ", "")
    lines = [r.getMessage() for r in caplog.records if r.name == "helios.access" and "/v1/chat" in r.getMessage()]
    assert len(lines) == 1 and "finish=tool_calls " in lines[0], lines
    assert served.stats().requests_finished.get("eos", 0) == finished + 1
