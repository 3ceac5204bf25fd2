"""Prometheus metrics of the worker (the API's come from Litestar's integration).

Each Worker has its own registry, so several workers in one process (tests) never clash;
`webhooks worker --metrics-port` serves it over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric

from service.store import Store, StoreError
from service.worker.capacity import BOUNDS, Capacity

log = logging.getLogger("webhooks.metrics")

# The worker's supervised tasks, as named in metrics, logs and `webhooks status`.
TASKS = ("listener", "recorder", "pruner", "loop", "lifecycle", "maintenance", "backlog",
         "backfill", "capacity")

# The failure lifecycle's events (webhook.<name>), as labels of their counter.
LIFECYCLE_EVENTS = ("failing", "recovered", "disabled")

ATTEMPT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)


class ReadCounter:
    """A counter kept as a plain int by what counts it and read (`read`) at each scrape:
    where the loop counts per round trip or per fan-out, a Counter's inc() (a lock, about
    a microsecond) would slow it down. The worker sets `read` (Crew); 0 until then."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.read: Callable[[], float] = lambda: 0.0
        registry.register(self)

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation)]

    def collect(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, value=self.read())]


class WorkerMetrics:
    """The worker's counters, attempt latency histogram and queue gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.deliveries = Counter("webhooks_deliveries", "Delivery attempts by outcome "
                                  "(succeeded, retry, failed)", ["outcome"], registry=r)
        self.attempt_seconds = Histogram("webhooks_delivery_attempt_seconds",
                                         "Duration of delivery attempts",
                                         buckets=ATTEMPT_BUCKETS, registry=r)
        self.fanned_out = Counter("webhooks_outbox_changes_processed",
                                  "Captured changes fanned out (wanted or not)", registry=r)
        self.due = Gauge("webhooks_deliveries_due", "Deliveries due now", registry=r)
        self.oldest_pending = Gauge("webhooks_oldest_pending_delivery_seconds",
                                    "Age of the oldest pending delivery", registry=r)
        self.outbox_statements = Gauge("webhooks_outbox_statements",
                                       "Captured statements waiting for fan-out", registry=r)
        self.outbox_lag = Gauge("webhooks_outbox_lag_seconds",
                                "Age of the oldest event waiting for fan-out", registry=r)
        self.task_restarts = Counter("webhooks_worker_task_restarts",
                                     "Restarts of the worker's background tasks after a "
                                     "crash", ["task"],
                                     registry=r)
        for task in TASKS:
            self.task_restarts.labels(task)  # shown at 0 before any crash
        self.lifecycle = Counter("webhooks_subscription_lifecycle_events",
                                 "Operational events of subscriptions (failing, recovered, "
                                 "disabled: disabled automatically)", ["event"], registry=r)
        for event in LIFECYCLE_EVENTS:
            self.lifecycle.labels(event)
        self.last_round = Gauge("webhooks_worker_last_round_timestamp_seconds",
                                "When the worker last completed a round of its loop (Unix "
                                "time; 0 before the first)", registry=r)
        self.listen_proof = Gauge("webhooks_worker_listen_proof_timestamp_seconds",
                                  "When the worker's LISTEN connection last proved alive by a "
                                  "round trip (Unix time; 0 before the first)", registry=r)
        self.listen_connections = Counter("webhooks_worker_listen_connections", "LISTEN "
                                          "connections the worker made (after the first, "
                                          "each replaced one that broke or hung)", registry=r)
        self.unwritten = Gauge("webhooks_worker_outcomes_unwritten", "Finished attempts "
                               "whose outcomes are not written yet", registry=r)
        self.in_flight = Gauge("webhooks_worker_deliveries_in_flight",
                               "Delivery attempts under way", registry=r)
        self.capacity = Gauge("webhooks_worker_capacity", "Deliveries the worker may have "
                              "in flight now (adaptive, up to the ceiling)", registry=r)
        self.capacity_ceiling = Gauge("webhooks_worker_capacity_ceiling", "The most "
                                      "deliveries in flight (WEBHOOKS_CONCURRENCY, or what "
                                      "the open-files limit allows)", registry=r)
        self.capacity_bound = Gauge("webhooks_worker_capacity_bound", "1 for what holds the "
                                    "capacity where it is now (demand, owner_share, cpu, "
                                    "memory, descriptors, ceiling), 0 for the others",
                                    ["bound"], registry=r)
        self.db_errors = Counter("webhooks_worker_db_errors", "Database errors the worker's "
                                 "loop or its failure lifecycle's round met and retried",
                                 registry=r)
        self.round_trips = ReadCounter("webhooks_worker_db_round_trips", "Database round "
                                       "trips of the worker's loop (fan-out, claim, next_due; "
                                       "a fan-out and its claim pipelined count once)", r)
        self.leased = ReadCounter("webhooks_worker_deliveries_leased_by_fanout",
                                  "Deliveries leased by the fan-out that made them (a quiet "
                                  "queue: no claim follows)", r)
        self.closed_inactive = Counter("webhooks_worker_deliveries_closed_inactive",
                                       "Due deliveries of inactive subscriptions closed as "
                                       "failed at once, without an attempt", registry=r)
        self.released = Counter("webhooks_worker_deliveries_released", "Claimed deliveries "
                                "given back at shutdown, not sent within the grace period",
                                registry=r)
        # The counters of each outcome, looked up once: observe() runs per attempt.
        self._outcomes = {outcome: self.deliveries.labels(label) for outcome, label in
                          (("succeeded", "succeeded"), ("pending", "retry"),
                           ("failed", "failed"))}

    def capacity_changed(self, capacity: Capacity,
                         in_flight: Callable[[], int] | None = None) -> None:
        """Shows a worker's capacity (service.worker.capacity.Capacity) and its bound; with
        `in_flight`, the attempts under way are read from it at each scrape."""
        if in_flight is not None:
            self.in_flight.set_function(in_flight)
        self.capacity.set(capacity.limit)
        self.capacity_ceiling.set(capacity.most)
        for bound in BOUNDS:
            self.capacity_bound.labels(bound).set(1 if bound == capacity.bound else 0)

    def observe(self, outcome: str, duration_ms: float) -> None:
        """Counts one finished attempt (`outcome`: succeeded, pending or failed)."""
        counter = self._outcomes.get(outcome)
        if counter is None:
            counter = self.deliveries.labels(outcome)
        counter.inc()
        self.attempt_seconds.observe(duration_ms / 1000.0)

    async def refresh(self, store: Store) -> None:
        """Reads the queue gauges from the database."""
        row = await store.metrics_gauges()
        if row is not None:
            due, oldest, outbox, lag = row
            self.due.set(due)
            self.oldest_pending.set(float(oldest))
            self.outbox_statements.set(outbox)
            self.outbox_lag.set(float(lag))

    async def refresh_loop(self, store: Store, every: float = 5.0) -> None:
        """Refreshes the gauges until cancelled; database errors only skip a round."""
        while True:
            try:
                await self.refresh(store)
            except StoreError as exc:
                log.warning("metrics refresh failed: %s", exc)
            await asyncio.sleep(every)

    def serve(self, port: int, host: str = "127.0.0.1",
              liveness: Callable[[], tuple[int, dict[str, Any]]] | None = None
              ) -> ThreadingHTTPServer:
        """Serves /metrics (and /livez, when `liveness` is given: its status and JSON body)
        on host:port from a background thread, apart from the worker's event loop, so a
        stuck loop still gets an answer that says so."""
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/livez" and liveness is not None:
                    status, body = liveness()
                    self._send(status, "application/json", json.dumps(body).encode())
                elif path in ("/metrics", "/"):
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                else:
                    self._send(404, "application/json", b'{"error": "not found"}')

            def do_HEAD(self) -> None:
                # As GET, without the body (uptime monitors and health checks use HEAD).
                self.head = True
                self.do_GET()

            def _send(self, status: int, kind: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not getattr(self, "head", False):
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="webhooks-metrics",
                         daemon=True).start()
        return server
