"""Prometheus exposition for /metrics.

One `CollectorRegistry` per server (no process-global state). Runtime values come from the model
worker's `StatsSnapshot` through a custom collector read at scrape time; HTTP-level outcomes
(429, 400) are counted here. Requests finished by reason and their prompt and generated tokens are
counted by the responses, from the counts their usage reports (`helios.server.request_metrics`),
not from the worker's engine-request counts (which count a prompt once per choice, and tokens the
frontend drops). Labels hold operation names, terminal reasons and status codes only.
"""

from __future__ import annotations

from typing import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from helios.runtime.records.stats import StatsSnapshot
from helios.server.access import CLIENT_CLOSED_REQUEST
from helios.server.responses import ClientGone


class _RuntimeCollector:
    def __init__(self, source: Callable[[], StatsSnapshot]):
        self._source = source

    def describe(self):
        return []

    def collect(self):
        s = self._source()
        yield _counter("helios_requests_admitted", "Engine requests (one per choice) admitted by the scheduler",
                       s.requests_admitted)
        yield _counter("helios_requests_rejected", "Engine requests (one per choice) rejected by scheduler admission",
                       s.requests_rejected)
        launches = CounterMetricFamily("helios_graph_launches", "Program launches, by operation", labels=["operation"])
        for operation, value in sorted(s.graph_launches.items()):
            launches.add_metric([operation], value)
        yield launches
        yield _counter("helios_second_frame_launches", "Plans submitted while another was still running on the device",
                       s.second_frames)
        yield _counter("helios_prefix_lookup_tokens", "Prompt tokens looked up in the prefix cache", s.prefix_lookup_tokens)
        yield _counter("helios_prefix_reused_tokens", "Prompt tokens served from the prefix cache", s.prefix_reused_tokens)
        yield _counter("helios_image_cache_hits", "Request images whose features were reused by content hash",
                       s.image_cache_hits)
        yield _counter("helios_image_cache_misses", "Request images encoded by a vision program", s.image_cache_misses)
        yield _counter("helios_snapshots_published", "Snapshots published", s.snapshots_published)
        yield _counter("helios_snapshots_evicted", "Snapshots evicted", s.snapshots_evicted)
        yield _counter("helios_snapshots_restored", "Snapshots restored into a request's pages and state rows",
                       s.snapshots_restored)
        yield _gauge("helios_cache_pages", "Physical cache pages", s.pages_total)
        yield _gauge("helios_cache_pages_free", "Cache pages free", s.pages_free)
        yield _gauge("helios_cache_pages_cached", "Unreferenced cache pages kept for prefix reuse", s.pages_cached)
        yield _gauge("helios_cache_window_pages", "Pages of the sliding-window region with its own page ids",
                     s.window_pages_total)
        yield _gauge("helios_cache_window_pages_free", "Window-region pages free", s.window_pages_free)
        yield _gauge("helios_cache_window_pages_cached", "Unreferenced window-region pages kept for prefix reuse",
                     s.window_pages_cached)
        yield _gauge("helios_requests_active", "Requests holding a slot", s.active_requests)
        yield _gauge("helios_requests_queued", "Requests waiting for scheduler admission", s.queued_requests)
        yield _gauge("helios_request_slots", "Selected concurrency (request slots)", s.request_slots)
        yield _gauge("helios_healthy", "1 while the model worker is healthy and responsive (as /health answers 200)", int(s.healthy))
        yield _counter(
            "flare_mixed_grammar_decode_steps",
            "Successful decode submissions whose lanes include constrained and unconstrained requests",
            s.mixed_grammar_decode_steps,
        )
        yield _gauge(
            "flare_constrained_max_inflight",
            "Maximum outstanding executor frames right after a constrained submission",
            s.constrained_max_inflight,
        )


def _counter(name: str, documentation: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _gauge(name: str, documentation: str, value: int) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class ServerMetrics:
    """The registry behind /metrics: runtime collector plus HTTP outcome counters."""

    def __init__(self, stats_source: Callable[[], StatsSnapshot]):
        self.registry = CollectorRegistry()
        self.registry.register(_RuntimeCollector(stats_source))
        self.http_responses = Counter(
            "helios_http_responses", "HTTP responses by endpoint and status", ["endpoint", "status"], registry=self.registry
        )

    def track_admission(self, permits_in_use: Callable[[], int], num_permits: int) -> None:
        """Exposes HTTP admission: permits held (preparing, queued, generating or being delivered)."""
        held = Gauge("helios_admission_permits_in_use", "HTTP admission permits held", registry=self.registry)
        held.set_function(permits_in_use)
        limit = Gauge("helios_admission_permits", "HTTP admission permits (max active + queue capacity)",
                      registry=self.registry)
        limit.set(num_permits)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ResponseCounter:
    """ASGI middleware counting HTTP responses by endpoint and status, one per request, the status
    the access log writes (`helios.server.access`). `endpoints` maps fixed paths to labels; a key
    ending in "/" maps every path under it (a route with a path parameter, ``/v1/models/{id}``).
    Other paths count as "other", so labels stay a small fixed set. A request whose client went away before
    its response started (it disconnected while its answer was computed, or the response's first
    write failed: found the client gone, or timed out) counts as 499, whether or not the application
    then answered. One the application raised for before its response started (other than
    `ClientGone`, which the `ClientGoneGuard` outside ends quietly), or that it left unanswered,
    counts as 500: the server's error handler, or the server, outside this middleware, answers it."""

    def __init__(self, app: ASGIApp, counter: Counter, endpoints: Mapping[str, str]):
        self.app = app
        self._counter = counter
        self._endpoints = endpoints
        self._prefixes = tuple((path, label) for path, label in endpoints.items() if path.endswith("/"))

    def _endpoint(self, path: str) -> str:
        label = self._endpoints.get(path)
        if label is None:
            label = next((name for prefix, name in self._prefixes if path.startswith(prefix)), "other")
        return label

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = self._endpoint(scope["path"])
        is_client_gone = is_counted = False

        def count(status: int) -> None:
            nonlocal is_counted
            if not is_counted:
                is_counted = True
                self._counter.labels(endpoint, str(status)).inc()

        async def noting_receive() -> Message:
            nonlocal is_client_gone
            message = await receive()
            if message["type"] == "http.disconnect":
                is_client_gone = True
            return message

        async def counting_send(message: Message) -> None:
            nonlocal is_client_gone
            if message["type"] != "http.response.start" or is_counted:
                await send(message)
                return
            try:
                await send(message)
            except BaseException:
                is_client_gone = True  # the answer went nowhere: 499, unless the application raises on
                raise
            count(CLIENT_CLOSED_REQUEST if is_client_gone else message["status"])

        try:
            await self.app(scope, noting_receive, counting_send)
        except ClientGone:  # a write found the client gone: ended quietly outside, as a disconnect
            count(CLIENT_CLOSED_REQUEST)
            raise
        except BaseException:  # answered 500 outside this middleware (Starlette's ServerErrorMiddleware)
            count(500)
            raise
        count(CLIENT_CLOSED_REQUEST if is_client_gone else 500)  # no answer: gone, or the server's 500
