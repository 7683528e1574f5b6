"""/metrics is exact: HTTP responses by endpoint and status count a client gone before its answer
started as 499, as the access log does."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helios.runtime.records.stats import WorkerStats
from helios.server.metrics import ResponseCounter, ServerMetrics


def parse(text: str) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def by_label(samples, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: v for (n, labels), v in samples.items() if n == name and v}


# -- HTTP responses of clients that left ------------------------------------------------------------


@pytest.mark.parametrize("answers, expected", [("before", "200"), ("after", "499"), ("never", "499")])
def test_a_response_to_a_client_gone_before_it_started_counts_as_499(runner, answers, expected):
    """As the access log writes it: a client that left before the answer started is a 499, whether
    the application then answers (before: a 200 to nobody) or returns without answering."""
    metrics = ServerMetrics(WorkerStats().snapshot)

    async def app(scope, receive, send):
        if answers == "before":
            await send({"type": "http.response.start", "status": 200, "headers": []})
        assert (await receive())["type"] == "http.disconnect"
        if answers == "after":
            await send({"type": "http.response.start", "status": 200, "headers": []})
        if answers != "never":
            await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        pass

    counted = ResponseCounter(app, metrics.http_responses, {"/v1/completions": "completions"})
    runner.run(counted({"type": "http", "path": "/v1/completions"}, receive, send))
    samples = parse(metrics.render().decode())
    assert by_label(samples, "helios_http_responses_total", "status") == {expected: 1.0}
