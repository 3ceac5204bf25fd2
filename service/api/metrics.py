"""Prometheus metrics of the API, served at GET /metrics.

Requests by route and status and their latency are counted by request_metrics, under the
names and labels of Litestar's Prometheus middleware; handshake outcomes are counted here.
Each app has its own registry, so several apps in one process (the tests) never share or
clash. Labels are bounded: route templates (never raw paths with ids), methods, statuses
and a fixed set of handshake outcomes; never a token, secret or target URL.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

from litestar import Request, Response, get
from litestar.plugins.prometheus import PrometheusController
from litestar.types import ASGIApp, HTTPScope, Message, Receive, Scope, Send
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase

PREFIX = "webhooks_api"
APP_NAME = "webhooks-api"
# Why a handshake ended: verified, or the target refused (answered, but not with 200 and
# the echoed header), timed out, or could not be reached.
HANDSHAKE_OUTCOMES = ("verified", "refused", "timeout", "unreachable")
LATENCY_BUCKETS: list[str | float] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                      0.5, 1.0, 2.5, 5.0, 10.0]
# The labels of each request's metrics, in their order (Litestar's Prometheus middleware's).
REQUEST_LABELS = ("method", "path", "status_code", "app_name")


class _Children:
    """One metric's labelled children, kept by their label values: prometheus_client's
    labels() checks the values and takes a lock at every call (4 to 5 µs), and a request
    asks four times. The children are the metric's own (the same objects its registry
    exports), and as many as the metric itself keeps."""

    __slots__ = ("children", "metric")

    def __init__(self, metric: MetricWrapperBase) -> None:
        self.metric = metric
        self.children: dict[tuple[Any, ...], Any] = {}

    def labels(self, *values: Any) -> Any:
        """The child of these label values, as metric.labels(*values) returns it."""
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = self.metric.labels(*values)
        return child


class ApiMetrics:
    """One app's registry: the request metrics (filled by the middleware) and handshakes."""

    def __init__(self, others: Sequence[CollectorRegistry] = ()) -> None:
        self.registry = CollectorRegistry()
        self.others = tuple(others)
        self.handshakes = Counter("webhooks_handshakes", "Verification handshakes by outcome "
                                  f"({', '.join(HANDSHAKE_OUTCOMES)})", ["outcome"],
                                  registry=self.registry)
        for outcome in HANDSHAKE_OUTCOMES:
            self.handshakes.labels(outcome)  # present at 0 before the first handshake
        # Created here rather than at the first request, so that a scrape of a fresh
        # process already names them all.
        r, labels = self.registry, REQUEST_LABELS
        made: dict[str, MetricWrapperBase] = {
            f"{PREFIX}_requests_total": Counter(
                f"{PREFIX}_requests_total", "Requests by route and status", labels, registry=r),
            f"{PREFIX}_request_duration_seconds": Histogram(
                f"{PREFIX}_request_duration_seconds", "Request duration, in seconds", labels,
                buckets=LATENCY_BUCKETS, registry=r),
            f"{PREFIX}_requests_in_progress": Gauge(
                f"{PREFIX}_requests_in_progress", "Requests being served", labels, registry=r),
            f"{PREFIX}_requests_error_total": Counter(
                f"{PREFIX}_requests_error_total", "Requests answered with a 5xx", labels,
                registry=r),
        }
        # request_metrics asks for them by name.
        self.request_metrics = {name: _Children(m) for name, m in made.items()}

    def handshake(self, outcome: str) -> None:
        """Counts one handshake; `outcome` is one of HANDSHAKE_OUTCOMES."""
        self.handshakes.labels(outcome if outcome in HANDSHAKE_OUTCOMES else "unreachable").inc()


def request_metrics(metrics: ApiMetrics, app_name: str = APP_NAME) -> Any:
    """ASGI middleware of an app's routes: counts each request by method, route template
    and status, observes its duration (until the body is sent) and keeps the gauge of
    those in progress, in `metrics`' registry, with the names and labels of Litestar's
    Prometheus middleware. It does only that: Litestar's built a Request, parsed the URL
    and copied dicts at every request, 14% of the instructions of a GET by id."""
    made = metrics.request_metrics
    in_progress = made[f"{PREFIX}_requests_in_progress"]
    count, errors = made[f"{PREFIX}_requests_total"], made[f"{PREFIX}_requests_error_total"]
    duration = made[f"{PREFIX}_request_duration_seconds"]

    def factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            method, path = cast(HTTPScope, scope)["method"], scope["path_template"]
            status, started, took = 200, time.perf_counter(), 0.0

            async def sent(message: Message) -> None:
                nonlocal status, took
                if message["type"] == "http.response.start":
                    status = message["status"]
                elif message["type"] == "http.response.body":
                    took = time.perf_counter() - started
                await send(message)

            gauge = in_progress.labels(method, path, 200, app_name)
            gauge.inc()
            try:
                await app(scope, receive, sent)
            finally:
                gauge.dec()
                if status >= 500:
                    errors.labels(method, path, status, app_name).inc()
                count.labels(method, path, status, app_name).inc()
                duration.labels(method, path, status, app_name).observe(took)

        return middleware

    return factory


class MetricsController(PrometheusController):
    """GET /metrics: the app's registry in the Prometheus text format (no token needed)."""

    path = "/metrics"

    @get(include_in_schema=False, sync_to_thread=False)
    def get(self, request: Request[Any, Any, Any]) -> Response[bytes]:
        metrics: ApiMetrics = request.app.state.metrics
        # Under `webhooks run` the worker of the same process adds its registry.
        body = b"".join(generate_latest(r) for r in (metrics.registry, *metrics.others))
        return Response(body, status_code=200, media_type=CONTENT_TYPE_LATEST)
