"""/metrics is exact under a random mix of requests an operator sees.

A seeded mix (chat and text completions, streamed and not, ``n`` 1 to 3, batched prompts, stops,
``max_tokens`` 0 to 8 with ``echo``, forced tool calls, repeated prompts that hit the prefix cache,
invalid bodies, requests the scheduler rejects or fails, requests whose output fails at its end,
crowds that get 429, and clients that disconnect at random points) runs against a tiny served core
in this process, in waves of concurrent requests. Every response's status, usage and finish
reasons are recorded (a request whose client left, or whose output failed, has no usage: its
access-log record, the request's `RequestRecord`, counts it). Once the server is idle, the scraped
/metrics must say exactly what the responses said:

- ``helios_http_responses_total`` by endpoint and status (499 for a client gone before its answer);
- ``helios_requests_finished_total`` by reason (one per choice; an output that failed an ``error``),
  ``helios_requests_rejected_total``;
- ``helios_prompt_tokens_total`` and ``helios_generated_tokens_total``: the sum of usage (each prompt
  once for ``n`` > 1; ``echo`` and ``max_tokens`` 0 as usage counts them; streams cut by a
  disconnect as their access-log record counts them);
- each latency histogram one observation per request that ran (finished or cancelled), the time to
  first token one per request with an output token; the token histograms sum to the usage;
- ``helios_prefix_reused_tokens_total``: the prompt tokens the responses report as reused;
- running, queued and admission gauges back at zero.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import random
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helios.errors import AdmissionRejected
from helios.runtime.records.stats import WorkerStats
from helios.server.access import RECORD_KEY
from helios.server.app import create_app
from helios.server.metrics import ResponseCounter, ServerMetrics
from support.asgi_scope import post_scope
from support.server_core import SERVED_ID, served_tiny_core

SEED = 20261205
NUM_WAVES = 8
WAVE = 9  # concurrent requests per wave: often more choices than the 10 permits, so some get 429
CROWDED_WAVE = 2  # all permits but two held meanwhile: some of this wave's requests surely get 429
KINDS = ("ok", "gone", "rejected", "failed", "broken")  # one of each more, one at a time (none gets 429)
WAIT_S = 60.0
KEY_HEADER = "x-test-key"
REJECTED_STOPS = ["#r1", "#r2", "#r3", "#r4"]  # the scheduler rejects these (503)
FAILED_STOPS = ["#e1", "#e2", "#e3", "#e4"]  # the scheduler raises on these (500)
BROKEN_USER = "broken-output"  # these requests' output processing fails at their end (500)
PROMPTS = [
    "hello",
    "the weather today is",
    " ".join(["once upon a time there was a small house by the sea"] * 3),  # over two pages: cache hits
    " ".join(["alpha beta gamma delta epsilon zeta eta theta"] * 4),
]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"], "additionalProperties": False}}}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class Rejected(AdmissionRejected):
    """The test's stand-in for a capacity the request exceeds."""


class BrokenEnd:
    """An output factory whose processors fail when the output ends."""

    def __init__(self, factory):
        self._factory = factory

    def for_choice(self, request_id):  # another choice of the request (`PreparedRequest.for_choice`): broken too
        return BrokenEnd(self._factory.for_choice(request_id))

    def create(self):
        processor = self._factory.create()

        def finish(*args, **kwargs):
            raise RuntimeError("broken by the test")

        processor.finish = finish
        return processor


def breaking(prepare):
    """`prepare`, with a broken output for the requests of `BROKEN_USER`."""

    def preparing(body, *args, **kwargs):
        prepared = prepare(body, *args, **kwargs)
        if body.user == BROKEN_USER:
            prepared = dataclasses.replace(prepared, output=BrokenEnd(prepared.output))
        return prepared

    return preparing


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), 2, frontend_workers=2) as served:
        scheduler = served.engine.scheduler
        submit = scheduler.submit

        def submitting(spec):
            if list(spec.stop_strings) == REJECTED_STOPS:
                raise Rejected("rejected by the test")
            if list(spec.stop_strings) == FAILED_STOPS:
                raise ValueError("failed by the test")
            return submit(spec)

        scheduler.submit = submitting
        served.frontend.prepare_chat = breaking(served.frontend.prepare_chat)
        served.frontend.prepare_completion = breaking(served.frontend.prepare_completion)
        yield served


@dataclass
class Outcome:
    """One request and what its client saw."""

    key: str
    endpoint: str
    body: object
    kind: str  # ok, gone, invalid, overloaded, rejected, failed, broken
    num_choices: int = 0  # engine requests it makes once admitted
    status: str = ""  # the label /metrics should count it under
    error_code: int | None = None  # a failure's code (a stream's error event's, once its headers are out)
    usage: dict | None = None
    finishes: list = field(default_factory=list)  # per choice, as the client saw them
    reused: int | None = None  # the response's reused_prompt_tokens (its first choice's), where reported
    record: object = None

    @property
    def ran(self) -> bool:
        return self.kind in ("ok", "gone")

    @property
    def is_submitted(self) -> bool:
        return self.kind in ("ok", "gone", "broken", "rejected", "failed")


# -- the mix -----------------------------------------------------------------------------------------


def valid_body(rng: random.Random, endpoint: str) -> dict:
    prompt = rng.choice(PROMPTS)
    body = {"model": SERVED_ID, "max_tokens": rng.randint(1, 8), "n": rng.choice([1, 1, 2, 3])}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        if rng.random() < 0.15:
            body.update(tools=[TOOL], tool_choice="required", max_tokens=rng.choice([4, 40]))
    else:
        body["prompt"] = prompt
        if rng.random() < 0.15:
            body["prompt"] = [prompt, rng.choice(PROMPTS)]
            body["n"] = rng.choice([1, 2])
        if rng.random() < 0.2:
            body["echo"] = True
            body["max_tokens"] = rng.choice([0, body["max_tokens"]])
    if rng.random() < 0.3 and "tools" not in body:
        body["stop"] = rng.sample(["e", "a", "o", " ", "t"], rng.randint(1, 2))
    if rng.random() < 0.5:
        body.update(temperature=1.0, seed=rng.randrange(1000))
    else:
        body["temperature"] = 0
    if rng.random() < 0.4:
        body["return_token_ids"] = True
    if rng.random() < 0.5:
        body["stream"] = True
        if rng.random() < 0.7:
            body["stream_options"] = {"include_usage": True}
    return body


def invalid_body(rng: random.Random, endpoint: str) -> tuple[object, str]:
    """A body the server refuses before admission, and its status."""
    base = valid_body(rng, endpoint)
    case = rng.choice(["n", "max_tokens", "unknown", "json", "model", "stops"])
    if case == "n":
        return {**base, "n": 0}, "400"
    if case == "max_tokens":
        return {**base, "max_tokens": -1}, "400"
    if case == "unknown":
        return {**base, "suffix": "x"}, "400"
    if case == "json":
        return b'{"model": ', "400"
    if case == "model":
        return {**base, "model": "not-served"}, "404"
    return {**base, "stop": ["a"] * 5}, "400"


def plan(rng: random.Random, index: int) -> Outcome:
    endpoint = rng.choice(["chat", "completions"])
    key = f"r{index}"
    draw = rng.random()
    if draw < 0.12:
        body, status = invalid_body(rng, endpoint)
        return Outcome(key, endpoint, body, "invalid", status=status)
    body = valid_body(rng, endpoint)
    if draw < 0.17:
        body.pop("tools", None), body.pop("tool_choice", None)
        return Outcome(key, endpoint, {**body, "stop": REJECTED_STOPS}, "rejected")
    if draw < 0.21:
        body.pop("tools", None), body.pop("tool_choice", None)
        return Outcome(key, endpoint, {**body, "stop": FAILED_STOPS}, "failed")
    if draw < 0.25:  # with stops or not, it counts the output it was given
        return Outcome(key, endpoint, {**body, "user": BROKEN_USER}, "broken")
    if draw < 0.40:
        body["max_tokens"] = rng.choice([body["max_tokens"], 60])  # long enough to be cut, often
        return Outcome(key, endpoint, body, "gone")
    return Outcome(key, endpoint, body, "ok")


def num_choices(body: dict) -> int:
    prompts = body["prompt"] if isinstance(body.get("prompt"), list) else [None]
    return body.get("n", 1) * len(prompts)


# -- running a request ---------------------------------------------------------------------------------


def capturing(app, records: dict):
    """`app`, keeping each request's `RequestRecord` (the access log's) by its test key."""

    async def asgi(scope, receive, send):
        try:
            await app(scope, receive, send)
        finally:
            headers = dict(scope.get("headers", ()))
            key = headers.get(KEY_HEADER.encode())
            if key is not None:
                records[key.decode()] = scope.get("state", {}).get(RECORD_KEY)

    return asgi


def read_sse(text: str, outcome: Outcome) -> None:
    """Usage, finish reasons and the error of a complete stream."""
    finishes: dict[int, str] = {}
    lines = text.split("\n")
    for number, line in enumerate(lines):
        if line == "event: error":
            outcome.error_code = json.loads(lines[number + 1][6:])["error"]["code"]
            return
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[6:])
        for choice in chunk["choices"]:
            if choice.get("finish_reason"):
                finishes[choice["index"]] = choice["finish_reason"]
        if chunk.get("usage"):
            outcome.usage = chunk["usage"]
        if "reused_prompt_tokens" in chunk:  # the response's, as in the JSON body: the first choice's
            outcome.reused = chunk["reused_prompt_tokens"]
    assert lines[-3:] == ["data: [DONE]", "", ""], text[-300:]
    outcome.finishes = [finishes[i] for i in sorted(finishes)]


async def post_keyed(client: httpx.AsyncClient, path: str, body, key: str) -> httpx.Response:
    """POSTs `body` (bytes as they are, else as JSON) with the test key header `capturing` files it by."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(path, content=content, headers={"content-type": "application/json", KEY_HEADER: key})


async def run_http(client: httpx.AsyncClient, outcome: Outcome) -> None:
    response = await post_keyed(client, PATHS[outcome.endpoint], outcome.body, outcome.key)
    outcome.status = str(response.status_code)
    if response.status_code != 200:
        outcome.error_code = response.status_code
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        read_sse(response.text, outcome)
    elif response.status_code == 200:
        data = response.json()
        outcome.usage = data["usage"]
        outcome.finishes = [choice["finish_reason"] for choice in data["choices"]]
        outcome.reused = data.get("reused_prompt_tokens")
    if outcome.status == "429":
        outcome.kind = "overloaded"
    elif outcome.kind == "ok" and outcome.error_code is not None:
        raise AssertionError(f"{outcome.body}: {response.text}")


async def run_disconnecting(app, outcome: Outcome, rng: random.Random) -> None:
    """The request through the ASGI app with a client that leaves: a stream after a random number
    of body messages, a JSON request after a random pause. Writes after it left go nowhere (as
    uvicorn's do)."""
    body = json.dumps(outcome.body).encode()
    path = PATHS[outcome.endpoint]
    scope = post_scope(path, body, ((KEY_HEADER.encode(), outcome.key.encode()),))
    is_stream = outcome.body.get("stream", False)
    leave_after = rng.randint(1, 4)
    pause_s = rng.choice([0.0, 0.001, 0.01, 0.03])
    requested, gone, told = asyncio.Event(), asyncio.Event(), False
    num_bodies = 0

    async def receive():
        nonlocal told
        if not requested.is_set():
            requested.set()
            return {"type": "http.request", "body": body, "more_body": False}
        if is_stream:
            await gone.wait()
        else:
            await asyncio.sleep(pause_s)
            gone.set()
        told = True
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal num_bodies
        if message["type"] == "http.response.start":
            outcome.status = "499" if told else str(message["status"])
        elif message["type"] == "http.response.body" and not gone.is_set():
            num_bodies += 1
            if num_bodies == leave_after or not message.get("more_body", False):
                gone.set()

    await asyncio.wait_for(app(scope, receive, send), WAIT_S)
    if outcome.status == "429":
        outcome.kind = "overloaded"


async def drive(app, served, outcomes: list[Outcome], records: dict, rng: random.Random) -> str:
    """Runs the waves of `outcomes`, then the last `len(KINDS)` one at a time."""
    transport = httpx.ASGITransport(app=app)
    waves = [outcomes[start:start + WAVE] for start in range(0, len(outcomes) - len(KINDS), WAVE)]
    waves += [[outcome] for outcome in outcomes[-len(KINDS):]]

    def run(outcome: Outcome):
        if outcome.kind == "gone":
            return run_disconnecting(app, outcome, random.Random(rng.random()))
        return run_http(client, outcome)

    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=WAIT_S) as client:
        for number, wave in enumerate(waves):
            crowd = served.admission.limits.num_permits - 2 if number == CROWDED_WAVE else 0
            held = served.admission.acquire_many(crowd) if crowd else []
            try:
                await asyncio.gather(*(run(outcome) for outcome in wave))
            finally:
                for permit in held:
                    permit.release()
        await idle(served, outcomes, records)
        response = await client.get("/metrics")
    assert response.status_code == 200
    return response.text


def ended(record) -> bool:
    return all(r.num_prompt_tokens is not None for r in (record, *record.choices))


async def idle(served, outcomes: list[Outcome], records: dict) -> None:
    """Every permit back, nothing running or queued, every request's record complete (a gauge the
    worker refreshes after its round's events went out may lag them: a stuck one never gets here)."""
    deadline = asyncio.get_running_loop().time() + WAIT_S

    def is_idle() -> bool:
        counters, stats = served.engine.scheduler.counters(), served.stats()
        return (served.admission.in_use == 0 and counters.num_running == 0 and counters.num_waiting == 0
                and stats.active_requests == 0 and stats.queued_requests == 0
                and all(ended(records[o.key]) for o in outcomes if o.is_submitted))

    while not is_idle():
        assert asyncio.get_running_loop().time() < deadline, "the server did not go idle"
        await asyncio.sleep(0.01)


# -- reading /metrics ---------------------------------------------------------------------------------


def parse(text: str) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def by_label(samples, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: v for (n, labels), v in samples.items() if n == name and v}


# -- the test ------------------------------------------------------------------------------------------


def test_metrics_equal_what_the_responses_said(runner, served):
    rng = random.Random(SEED)
    records: dict = {}
    app = capturing(create_app(served), records)
    outcomes = [plan(rng, i) for i in range(NUM_WAVES * WAVE)]
    for kind in KINDS:
        outcome = plan(rng, len(outcomes))
        while outcome.kind != kind:
            outcome = plan(rng, len(outcomes))
        outcomes.append(outcome)
    for outcome in outcomes:
        if outcome.kind != "invalid":
            outcome.num_choices = num_choices(outcome.body)
    text = runner.run(drive(app, served, outcomes, records, rng))
    for outcome in outcomes:
        outcome.record = records.get(outcome.key)
    kinds = collections.Counter(o.kind for o in outcomes)
    assert all(kinds[k] for k in ("ok", "gone", "invalid", "rejected", "failed", "broken", "overloaded")), kinds
    for kind, code in (("rejected", 503), ("failed", 500), ("broken", 500)):
        assert all(o.error_code == code for o in outcomes if o.kind == kind), kind
    problems = discrepancies(outcomes, parse(text))
    assert not problems, "\n".join(problems)


def choice_records(outcome: Outcome) -> tuple:
    return (outcome.record, *outcome.record.choices)


def discrepancies(outcomes: list[Outcome], samples) -> list[str]:
    """Every way /metrics differs from what the responses said (empty: none)."""
    problems = []

    def check(what: str, exposed, expected) -> None:
        if exposed != expected:
            problems.append(f"{what}: server says {exposed}, responses say {expected}")

    ran = [o for o in outcomes if o.ran]
    ok = [o for o in outcomes if o.kind == "ok"]
    broken = [o for o in outcomes if o.kind == "broken"]

    # what each response said agrees with its access-log record (which counts the ones cut short);
    # a request that failed in its output counts the tokens it was given, and the prompts of its
    # choices that did not fail
    usage = {}
    for outcome in broken:
        records_of = choice_records(outcome)
        prompts = {r.prompt_index: r.num_prompt_tokens for r in records_of if r.finish_reason != "error"}
        usage[outcome.key] = sum(prompts.values()), sum(r.num_output_tokens for r in records_of)
    for outcome in ran:
        usage[outcome.key] = outcome.record.totals()
        if outcome.kind == "ok" and outcome.usage is not None:
            check(f"access-log tokens of {outcome.key} (n {outcome.num_choices})", usage[outcome.key],
                  (outcome.usage["prompt_tokens"], outcome.usage["completion_tokens"]))
    prompt_tokens, output_tokens = sum(p for p, _ in usage.values()), sum(c for _, c in usage.values())

    # HTTP responses by endpoint and status
    statuses = collections.Counter((o.endpoint, o.status) for o in outcomes)
    exposed = {(dict(labels)["endpoint"], dict(labels)["status"]): v for (n, labels), v in samples.items()
               if n == "helios_http_responses_total" and dict(labels)["endpoint"] != "metrics"}
    check("responses by endpoint and status", exposed, dict(statuses))

    # requests by terminal reason: one per choice (the client sees eos and stop both as "stop")
    seen = collections.Counter()
    for outcome in ok:
        seen.update({"tool_calls": "stop"}.get(f, f) for f in outcome.finishes)
    for outcome in outcomes:
        if outcome.kind in ("gone", "broken"):
            seen.update({"eos": "stop"}.get(r.finish_reason, r.finish_reason) for r in choice_records(outcome))
    seen["error"] += sum(o.num_choices for o in outcomes if o.kind == "failed")
    exposed_reasons = collections.Counter()
    for reason, count in by_label(samples, "helios_requests_finished_total", "reason").items():
        exposed_reasons[{"eos": "stop"}.get(reason, reason)] += count
    check("requests finished by reason", dict(exposed_reasons), dict(+seen))
    check("requests rejected", value(samples, "helios_requests_rejected_total"),
          sum(o.num_choices for o in outcomes if o.kind == "rejected"))

    # tokens: the sum of usage
    check("prompt tokens", value(samples, "helios_prompt_tokens_total"), prompt_tokens)
    check("generated tokens", value(samples, "helios_generated_tokens_total"), output_tokens)

    # histograms: one observation per request that ran, the time to first token per request with a token
    label = {"model_name": SERVED_ID}
    for name in ("helios_e2e_request_latency_seconds", "helios_request_queue_time_seconds",
                 "helios_request_prompt_tokens", "helios_request_generation_tokens"):
        check(f"{name} observations", value(samples, f"{name}_count", **label), len(ran))
    check("prompt-token histogram sum", value(samples, "helios_request_prompt_tokens_sum", **label),
          sum(usage[o.key][0] for o in ran))
    check("generation-token histogram sum", value(samples, "helios_request_generation_tokens_sum", **label),
          sum(usage[o.key][1] for o in ran))
    check("time-to-first-token observations", value(samples, "helios_time_to_first_token_seconds_count", **label),
          sum(usage[o.key][1] > 0 for o in ran + broken))
    check("time-per-output-token observations",
          value(samples, "helios_time_per_output_token_seconds_count", **label),
          sum(max(r.num_output_tokens for r in choice_records(o)) > 1 for o in ran))

    # the prefix cache: reused tokens as the responses report them
    reused = [getattr(r, "num_reused_tokens", None) for o in ran + broken for r in choice_records(o)]
    check("prefix reused tokens", value(samples, "helios_prefix_reused_tokens_total"), sum(n or 0 for n in reused))
    for outcome in ok:
        if outcome.reused is not None:
            check(f"reused tokens of {outcome.key}", getattr(outcome.record, "num_reused_tokens", None),
                  outcome.reused)
    lookups, reuses = (value(samples, f"helios_prefix_{name}_tokens_total") for name in ("lookup", "reused"))
    if not lookups >= reuses > 0:
        problems.append("the mix looked up fewer prompt tokens than it reused, or reused none")

    # idle: nothing running, queued or holding a permit
    for name in ("helios_requests_active", "helios_requests_queued", "helios_admission_permits_in_use"):
        check(name, value(samples, name), 0)
    return problems


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
