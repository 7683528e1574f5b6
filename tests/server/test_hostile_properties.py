"""Property: arbitrary JSON and bytes, unicode edge cases included, through every endpoint of the
app with the model worker running. Whatever arrives, the answer is never a 5xx other than a
scheduler admission rejection (503 of type ``admission_rejected``, the documented answer for a
request beyond the prepared capacities); afterwards the worker is alive, /health is 200, and no
admission permit, running request or page is left held.

Bounded for CI: a few dozen examples per property, tiny output limits.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helios.core.reader import open_core
from helios.runtime.service import RuntimeOptions, build_runtime
from helios.server.app import create_app
from helios.server.service import ServedModel
from support.server_core import SERVED_ID, tiny_core

EDGE_TEXT = ["\ud800", "\udfff", "a\udc80b", "\ufeff", "\x00", "\U0010ffff", "\u2028", "\u202e", "e\u0301",
             "\U0001f600", "\\", '"', "", " " * 40, "<|im_start|>", "</think>", "{{ 7*7 }}", "{% raw %}"]
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=24) | st.sampled_from(EDGE_TEXT)
SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=12)
FIELDS = ["model", "messages", "prompt", "max_tokens", "temperature", "stop", "stream", "tools", "tool_choice",
          "response_format", "seed", "top_p", "logit_bias", "chat_template_kwargs", "stop_token_ids", "user", "n"]
GOOD = {"/v1/chat/completions": {"model": SERVED_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        "/v1/completions": {"model": SERVED_ID, "prompt": "hi", "max_tokens": 3}}


@st.composite
def mutated_bodies(draw):
    """A valid body with fields replaced, added or dropped, message texts and roles varied."""
    path = draw(st.sampled_from(sorted(GOOD)))
    body = json.loads(json.dumps(GOOD[path]))
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(FIELDS))
        action = draw(st.sampled_from(["replace", "drop", "text"]))
        if action == "drop":
            body.pop(field, None)
        elif action == "text" and "messages" in body:
            body["messages"] = [{"role": draw(st.sampled_from(["user", "system", "assistant", "tool", "x"])),
                                 "content": draw(TEXT)} for _ in range(draw(st.integers(1, 3)))]
        else:
            body[field] = draw(JSON)
    body["max_tokens"] = draw(st.sampled_from([body.get("max_tokens", 3), 1, 3]))
    return path, body


def encodings(value) -> st.SearchStrategy[bytes]:
    text = json.dumps(value, ensure_ascii=False)
    return st.sampled_from([
        text.encode("utf-8", "surrogatepass"),
        json.dumps(value).encode(),
        b"\xef\xbb\xbf" + text.encode("utf-8", "surrogatepass"),
        text.encode("utf-16", "surrogatepass"),
    ])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    opened = open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key])
    runtime = build_runtime(opened, RuntimeOptions(queue_capacity=4))
    served = ServedModel.from_runtime(runtime, queue_capacity=4, frontend_workers=2)
    served.start()
    yield served
    served.shutdown()


@pytest.fixture(scope="module")
def app(served):
    return create_app(served, max_body_nbytes=256 * 1024)


def request(app, method: str, path: str, content: bytes | None = None) -> httpx.Response:
    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
            headers = {"content-type": "application/json"}
            return await client.request(method, path, content=content, headers=headers)

    return asyncio.run(scenario())


def assert_answer(response: httpx.Response) -> None:
    status = response.status_code
    assert status < 500 or (status == 503 and response.json()["error"]["type"] == "admission_rejected"), (
        status, response.text[:500])
    if status >= 400:
        assert set(response.json()["error"]) >= {"message", "type", "code"}


def assert_idle_and_healthy(app, served) -> None:
    assert served.is_healthy and request(app, "GET", "/health").status_code == 200
    for _ in range(200):
        stats = served.stats()
        if served.admission.in_use == 0 and stats.active_requests == 0 and stats.queued_requests == 0:
            break
        asyncio.run(asyncio.sleep(0.01))
    stats = served.stats()
    assert served.admission.in_use == 0
    assert stats.active_requests == 0 and stats.queued_requests == 0
    assert stats.pages_free + stats.pages_cached == stats.pages_total


PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                           HealthCheck.too_slow])


@PROPERTY
@given(data=st.data())
def test_arbitrary_json_bodies_on_every_post_endpoint(app, served, data):
    path = data.draw(st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/models", "/health"]))
    content = data.draw(JSON.flatmap(encodings))
    assert_answer(request(app, "POST", path, content))


@PROPERTY
@given(case=mutated_bodies(), stream=st.booleans())
def test_mutated_completion_bodies(app, served, case, stream):
    path, body = case
    body = {**body, "stream": stream} if "stream" not in body else body
    content = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    response = request(app, "POST", path, content)
    assert_answer(response)
    if response.status_code == 200 and body.get("stream") is True:
        text = response.text
        assert text.rstrip().endswith("data: [DONE]") or text.count("event: error") == 1


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/v1/models/", "/health", "/metrics", "/openapi.json", "/v1/models", "/"]), tail=TEXT)
def test_arbitrary_get_paths(app, served, path, tail):
    quoted = quote(tail.encode("utf-8", "surrogatepass"), safe="") if path.endswith("/") else ""
    assert_answer(request(app, "GET", path + quoted))


def test_afterwards_the_worker_is_alive_and_nothing_is_held(app, served):
    """Runs after the properties above (same module, same served model)."""
    assert request(app, "POST", "/v1/chat/completions", json.dumps(GOOD["/v1/chat/completions"]).encode()).status_code == 200
    assert_idle_and_healthy(app, served)
