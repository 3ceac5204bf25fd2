"""Prometheus metrics of the API, served at GET /metrics.

Requests by route and status and their latency come from Litestar's Prometheus integration;
handshake outcomes are counted here. Litestar's middleware keeps its metrics in the global
registry, class-wide; the subclasses below give each app its own registry instead, so several
apps in one process (the tests) never share or clash. Labels are bounded: route templates
(never raw paths with ids), methods, statuses and a fixed set of handshake outcomes; never a
token, secret or target URL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from litestar import Request, Response, get
from litestar.plugins.prometheus import (
    PrometheusConfig,
    PrometheusController,
    PrometheusMiddleware,
)
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
# Why a handshake ended: verified, or the target refused (answered, but not with 200 and
# the echoed header), timed out, or could not be reached.
HANDSHAKE_OUTCOMES = ("verified", "refused", "timeout", "unreachable")
LATENCY_BUCKETS: list[str | float] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                      0.5, 1.0, 2.5, 5.0, 10.0]
# The labels Litestar's middleware gives each request, in its order.
REQUEST_LABELS = ("method", "path", "status_code", "app_name")


class _Children:
    """One metric's labelled children, kept by their label values: prometheus_client's
    labels() checks the values and takes a lock at every call (4 to 5 µs), and Litestar's
    middleware calls it four times a request. The children are the metric's own (the same
    objects its registry exports), and as many as the metric itself keeps."""

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
        # The middleware asks for them by name (_Middleware._metric).
        self.request_metrics = {name: _Children(m) for name, m in made.items()}

    def handshake(self, outcome: str) -> None:
        """Counts one handshake; `outcome` is one of HANDSHAKE_OUTCOMES."""
        self.handshakes.labels(outcome if outcome in HANDSHAKE_OUTCOMES else "unreachable").inc()


@dataclass
class MetricsConfig(PrometheusConfig):
    """PrometheusConfig that carries the app's own metrics registry."""

    metrics: ApiMetrics = field(default_factory=ApiMetrics)


class _Middleware(PrometheusMiddleware):
    """Litestar's middleware, with its metrics kept in the app's registry and their
    labelled children looked up once per set of label values."""

    def _metric(self, kind: type[MetricWrapperBase], suffix: str, doc: str,
                labels: dict[str, Any], **kwargs: Any) -> Any:
        metrics = cast(MetricsConfig, self._config).metrics
        name = f"{self._config.prefix}_{suffix}"
        if name not in metrics.request_metrics:
            metrics.request_metrics[name] = _Children(kind(name, doc, [*labels],
                                                           registry=metrics.registry,
                                                           **kwargs))
        return metrics.request_metrics[name]

    def request_count(self, labels: dict[str, Any]) -> Counter:
        return cast(Counter, self._metric(Counter, "requests_total", "Requests by route and "
                                          "status", labels))

    def request_time(self, labels: dict[str, Any]) -> Histogram:
        return cast(Histogram, self._metric(Histogram, "request_duration_seconds",
                                            "Request duration, in seconds", labels,
                                            **self._kwargs))

    def requests_in_progress(self, labels: dict[str, Any]) -> Gauge:
        return cast(Gauge, self._metric(Gauge, "requests_in_progress",
                                        "Requests being served", labels))

    def requests_error_count(self, labels: dict[str, Any]) -> Counter:
        return cast(Counter, self._metric(Counter, "requests_error_total",
                                          "Requests answered with a 5xx", labels))


def metrics_config(metrics: ApiMetrics) -> MetricsConfig:
    """The Prometheus middleware configuration of an app whose registry is `metrics`."""
    return MetricsConfig(metrics=metrics, app_name="webhooks-api", prefix=PREFIX,
                         group_path=True, buckets=LATENCY_BUCKETS,
                         middleware_class=_Middleware)


class MetricsController(PrometheusController):
    """GET /metrics: the app's registry in the Prometheus text format (no token needed)."""

    path = "/metrics"

    @get(include_in_schema=False, sync_to_thread=False)
    def get(self, request: Request[Any, Any, Any]) -> Response[bytes]:
        metrics: ApiMetrics = request.app.state.metrics
        # Under `webhooks run` the worker of the same process adds its registry.
        body = b"".join(generate_latest(r) for r in (metrics.registry, *metrics.others))
        return Response(body, status_code=200, media_type=CONTENT_TYPE_LATEST)
