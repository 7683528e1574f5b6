"""What operators get: latency and length histograms labelled by model name, the API key, served
names and aliases, and one access-log line per request (in-process app over a real tiny core)."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from helios.server.app import create_app
from support.server_core import NAMESPACE, SERVED_ID, served_tiny_core

KEY = "sk-test-key"
NAMES = ("house-model", "house-alias")
HISTOGRAMS = ("helios_time_to_first_token_seconds", "helios_time_per_output_token_seconds",
              "helios_e2e_request_latency_seconds", "helios_request_queue_time_seconds",
              "helios_request_prompt_tokens", "helios_request_generation_tokens")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 4, frontend_workers=2, owned_by=NAMESPACE, served_names=NAMES) as served:
        yield served


@pytest.fixture(scope="module")
def app(served):
    return create_app(served, api_key=KEY)


def client(app, key: str = KEY) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key=key, max_retries=0, http_client=http)


async def get(app, path: str, **headers) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        return await http.get(path, headers=headers)


def sample(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_requests_without_the_api_key_get_401(runner, app):
    for key in ("wrong", KEY + "x"):
        with pytest.raises(openai.AuthenticationError) as caught:
            runner.run(client(app, key).chat.completions.create(
                model=NAMES[0], messages=[{"role": "user", "content": "hi"}], max_tokens=2))
        assert caught.value.status_code == 401 and caught.value.body["type"] == "authentication_error"
    assert runner.run(get(app, "/v1/models")).status_code == 401
    assert runner.run(get(app, "/v1/models", authorization=f"Bearer {KEY}")).status_code == 200
    for open_path in ("/health", "/metrics", "/openapi.json", "/version"):
        assert runner.run(get(app, open_path)).status_code == 200


def test_the_tokenizer_endpoints_need_the_api_key(runner, app):
    """/tokenize and /detokenize render and tokenize on the server's CPU: guarded as /v1/ is."""
    async def post(path: str, body: dict, **headers) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            return await http.post(path, json=body, headers=headers)

    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [3]})):
        refused = runner.run(post(path, body))
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert runner.run(post(path, body, authorization=f"Bearer {KEY}")).status_code == 200


@pytest.mark.parametrize("header, status", [
    (f"bearer {KEY}", 200), (f"BEARER  {KEY}", 200),  # HTTP's auth schemes are case-insensitive
    (f"Basic {KEY}", 401), (f"Bearer{KEY}", 401), (KEY, 401), (f"Bearer {KEY} ", 401), ("Bearer", 401),
])
def test_the_bearer_scheme_is_read_in_any_case_and_nothing_else_passes(runner, app, header, status):
    assert runner.run(get(app, "/v1/models", authorization=header)).status_code == status


def test_served_names_and_aliases_replace_the_contracts(runner, app):
    api = client(app)
    async def names():
        return [model.id async for model in api.models.list()]

    assert runner.run(names()) == list(NAMES)
    for name in NAMES:
        response = runner.run(api.completions.create(model=name, prompt="hello", max_tokens=2))
        assert response.model == NAMES[0]
    with pytest.raises(openai.NotFoundError, match="not served here"):
        runner.run(api.completions.create(model=SERVED_ID, prompt="hello", max_tokens=2))


@pytest.mark.parametrize("stream", [False, True])
def test_histograms_with_model_name_and_one_access_line_per_request(runner, app, caplog, stream):
    before = runner.run(get(app, "/metrics")).text
    label = f'{{model_name="{NAMES[0]}"}}'
    counts = {name: sample(before, f"{name}_count{label}") if f"{name}_count{label}" in before else 0.0
              for name in HISTOGRAMS}
    caplog.set_level(logging.INFO, logger="helios.access")
    response = runner.run(client(app).completions.create(model=NAMES[1], prompt="hello", max_tokens=4,
                                                         temperature=0, user="alice", stream=stream))
    if stream:
        async def drain():
            return [chunk async for chunk in response]

        runner.run(drain())
    metrics = runner.run(get(app, "/metrics")).text
    for name in HISTOGRAMS:
        assert sample(metrics, f"{name}_count{label}") == counts[name] + 1, name
    assert 'helios_request_generation_tokens_bucket{le="4.0",model_name="house-model"}' in metrics
    assert "flare_mixed_grammar_decode_steps_total" in metrics and "flare_constrained_max_inflight" in metrics
    lines = [r.getMessage() for r in caplog.records if r.name == "helios.access" and "/v1/completions" in r.getMessage()]
    assert len(lines) == 1, lines
    line = lines[0]
    assert '"POST /v1/completions" 200' in line and "completion_tokens=4" in line and "finish=length" in line
    assert "latency_ms=" in line and "ttft_ms=" in line and 'user="alice"' in line and "prompt_tokens=" in line


def test_access_line_of_several_choices_counts_them_all(runner, app, caplog):
    caplog.set_level(logging.INFO, logger="helios.access")
    runner.run(client(app).completions.create(model=NAMES[0], prompt="hello", max_tokens=3, n=2, temperature=0))
    (line,) = [r.getMessage() for r in caplog.records if r.name == "helios.access" and "/v1/completions" in r.getMessage()]
    assert "completion_tokens=6" in line and "choices=2" in line


def test_access_line_of_a_refused_request(runner, app, caplog):
    caplog.set_level(logging.INFO, logger="helios.access")
    assert runner.run(get(app, "/v1/models")).status_code == 401
    assert any('"GET /v1/models" 401' in r.getMessage() for r in caplog.records if r.name == "helios.access")


def _access_status(app_behaviour, caplog, disconnect: bool = False) -> str:
    """The status the access log writes for an application that `app_behaviour`s without answering."""
    import asyncio

    from helios.server.access import AccessLog

    async def inner(scope, receive, send):
        await receive()
        await app_behaviour()

    async def receive():
        return {"type": "http.disconnect"} if disconnect else {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        pass

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": ("127.0.0.1", 9)}
    caplog.set_level(logging.INFO, logger="helios.access")
    try:
        asyncio.run(AccessLog(inner)(scope, receive, send))
    except RuntimeError:
        pass
    (line,) = [r.getMessage() for r in caplog.records if r.name == "helios.access"]
    return line.split('" ')[1].split()[0]


async def _returns():
    return None


async def _raises():
    raise RuntimeError("a bug")


def test_no_response_is_499_when_the_client_left_and_500_when_the_server_failed(caplog):
    assert _access_status(_returns, caplog, disconnect=True) == "499"  # it left while sending its body
    caplog.clear()
    assert _access_status(_raises, caplog, disconnect=True) == "500"  # the server failed, whoever left
    caplog.clear()
    assert _access_status(_returns, caplog) == "500"  # returned without answering: a server bug
