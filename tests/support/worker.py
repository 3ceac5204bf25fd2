"""A running worker: its settings for a test, a worker in this event loop or the environment
of a `webhooks worker` process, and what tests check of its deliveries."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from service.config import Settings
from service.store import make_pool
from service.worker.loop import Worker, open_worker


def make_settings(db_url: str, **overrides: Any) -> Settings:
    """Settings for a test: loopback targets allowed, fast retries, short timeouts."""
    values: dict[str, Any] = {
        "database_url": db_url,
        "allow_private_targets": True,
        "retry_schedule": (0.05, 0.05, 0.05),
        "delivery_timeout": 2.0,
        "poll_interval": 1.0,
        "lease": 30.0,
        "shutdown_grace": 2.0,
    }
    values.update(overrides)
    return Settings(**values)


def add_invoice(conn: psycopg.Connection, number: str, *, company: str = "acme",
                amount: str = "10.00") -> int:
    """Inserts one invoice; returns its id."""
    row = conn.execute(
        "INSERT INTO invoices (number, customer, amount, company_id) VALUES (%s, 'c', %s, %s)"
        " RETURNING id", (number, amount, company)).fetchone()
    assert row is not None
    return row[0]


def payloads(received: list[Any]) -> list[dict[str, Any]]:
    """The JSON bodies of received deliveries."""
    return [json.loads(r.body) for r in received]


def numbers(received: list[Any]) -> list[str]:
    """The invoice numbers carried by received deliveries, in arrival order."""
    return [p["resource"]["number"] for p in payloads(received) if "resource" in p]


async def poll(predicate: Callable[[], object], timeout: float = 10.0,
               what: str = "condition") -> None:
    """Waits until `predicate()` is true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        await asyncio.sleep(0.02)


def metric(worker: Worker, name: str, **labels: str) -> float:
    """A sample of the worker's metrics (its registry) by its exposed name, e.g.
    metric(worker, "webhooks_deliveries_total", outcome="succeeded"); 0 when absent."""
    return worker.metrics.registry.get_sample_value(name, labels) or 0.0


def listen_connections(worker: Worker) -> float:
    """LISTEN connections the worker made so far (webhooks_worker_listen_connections)."""
    return metric(worker, "webhooks_worker_listen_connections_total")


def listen_proof(worker: Worker) -> float:
    """When the worker's LISTEN connection last proved alive (Unix time; 0 before)."""
    return metric(worker, "webhooks_worker_listen_proof_timestamp_seconds")


def maintained(conn: psycopg.Connection[Any],
               counter: Literal["analyze_count", "vacuum_count"]) -> int:
    """Manual ANALYZEs or VACUUMs so far (that counter of pg_stat_user_tables) of the
    deliveries partitions being filled."""
    row = conn.execute(sql.SQL(
        "SELECT coalesce(sum(s.{}), 0) FROM pg_stat_user_tables s"
        "  JOIN webhooks.queue_partitions p ON s.relname = p.partition"
        " WHERE s.schemaname = 'webhooks' AND p.parent = 'deliveries'"
        "   AND p.lower_bound <= now() AND p.upper_bound > now()").format(
            sql.Identifier(counter))).fetchone()
    assert row is not None
    return int(row[0])


@asynccontextmanager
async def open_pool(db_url: str, max_size: int = 8) -> AsyncIterator[AsyncConnectionPool]:
    """An open pool on the test database."""
    p = make_pool(db_url, min_size=1, max_size=max_size, name="test")
    await p.open(wait=True)
    try:
        yield p
    finally:
        await p.close()


@asynccontextmanager
async def running_worker(db_url: str, concurrency: int = 16, **overrides: Any
                         ) -> AsyncIterator[Worker]:
    """A worker running in this event loop until the block ends."""
    async with open_worker(make_settings(db_url, **overrides),
                           concurrency=concurrency) as worker:
        try:
            async with asyncio.timeout(30):
                await worker.listener.connected.wait()
        except TimeoutError:
            raise AssertionError("the worker's LISTEN connection was not up within 30 s"
                                 ) from None
        yield worker


def worker_env(db_url: str, **extra: str) -> dict[str, str]:
    """Environment of a `webhooks worker` subprocess for the test database."""
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": db_url,
        "WEBHOOKS_ALLOW_PRIVATE_TARGETS": "true",
        "WEBHOOKS_RETRY_SCHEDULE": "50ms,50ms,50ms",
        "WEBHOOKS_POLL_INTERVAL": "0.5",
        "WEBHOOKS_DELIVERY_TIMEOUT": "2",
    })
    env.update(extra)
    return env
