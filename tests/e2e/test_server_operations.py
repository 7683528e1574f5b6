"""`helios serve` for operators, end to end: the API key from HELIOS_API_KEY, served names with an
alias, one access-log line per request on stderr, latency histograms in /metrics."""

from __future__ import annotations

import signal

import httpx
import openai
import pytest

from support.server_core import ServerProcess, tiny_core

KEY = "sk-e2e"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HELIOS_API_KEY", KEY)
        process = ServerProcess(core, "--served-model-name", "house", "house-alias",
                                log=tmp_path_factory.mktemp("serve-ops") / "server.log")
    yield process
    code, log = process.terminate()
    assert code == -signal.SIGTERM and "Traceback" not in log, log


def test_key_names_access_log_and_histograms(server):
    anonymous = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        anonymous.models.list()
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    assert [model.id for model in api.models.list().data] == ["house", "house-alias"]
    response = api.completions.create(model="house-alias", prompt="hello", max_tokens=3, temperature=0, user="bob")
    assert response.model == "house" and response.usage.completion_tokens == 3
    streamed = list(api.chat.completions.create(model="house", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2, temperature=0, stream=True))
    assert streamed[-1].choices[0].finish_reason == "length"
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert 'helios_e2e_request_latency_seconds_count{model_name="house"} 2.0' in metrics
    log = server.log.read_text()
    lines = [line for line in log.splitlines() if "access:" in line and "/v1/" in line]
    assert any('"GET /v1/models" 401' in line for line in lines)
    completion = [line for line in lines if '"POST /v1/completions" 200' in line]
    assert len(completion) == 1 and "completion_tokens=3" in completion[0] and 'user="bob"' in completion[0]
    assert any('"POST /v1/chat/completions" 200' in line and "completion_tokens=2" in line for line in lines)
