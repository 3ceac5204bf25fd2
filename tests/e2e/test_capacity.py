"""The worker's capacity in flight with default settings (service/worker/capacity.py):
many slow targets get far more than a fixed 64 in flight, and each owner still holds at
most half of the capacity. Throughput is `make bench`'s (slow_targets), not a test's."""

from __future__ import annotations

import asyncio
from collections import Counter

import psycopg
from aiohttp import web

from service.config import Settings
from service.worker.capacity import FLOOR, rss_bytes
from tests.support.receivers import Received, Receiver
from tests.support.subscriptions import new_secret, subscribe_many
from tests.support.worker import metric, running_worker

OWNERS = ("a", "b", "c")
PER_OWNER = 100  # subscriptions, each with its own tenant
ROWS = 4  # per tenant


async def test_many_slow_targets_get_far_more_than_64_in_flight(
        db_url: str, conn: psycopg.Connection) -> None:
    now: Counter[str] = Counter()
    most: Counter[str] = Counter()

    async def slow(req: Received) -> web.StreamResponse:
        owner = req.path.rstrip("/").rsplit("/", 1)[-1]
        now[owner] += 1
        now["all"] += 1
        most[owner] = max(most[owner], now[owner])
        most["all"] = max(most["all"], now["all"])
        try:
            await asyncio.sleep(0.3)  # a target across the internet
        finally:
            now[owner] -= 1
            now["all"] -= 1
        return web.Response(status=200)

    async with Receiver(behaviour=slow) as receiver:
        for owner in OWNERS:
            subscribe_many(conn, PER_OWNER, resource="invoices", events=["invoice.create"],
                           owner=owner, tenant=owner, target=f"{receiver.url}/{owner}",
                           secret=new_secret())
        conn.execute(
            "INSERT INTO invoices (number, customer, amount, company_id)"
            " SELECT o || i || '-' || j, 'c', 1, o || i FROM unnest(%s::text[]) o,"
            " generate_series(1, %s) i, generate_series(1, %s) j",
            (list(OWNERS), PER_OWNER, ROWS))
        total = len(OWNERS) * PER_OWNER * ROWS
        defaults = Settings()
        # The defaults, but for the delivery timeout, which the test settings shorten, and
        # the memory budget: this worker shares the test run's process, whose resident set
        # after hundreds of tests is not the worker's (it may be past the default budget).
        async with running_worker(db_url, concurrency=defaults.concurrency,
                                  delivery_timeout=defaults.delivery_timeout,
                                  memory_budget=defaults.memory_budget + rss_bytes()
                                  ) as worker:
            assert worker.capacity.limit == FLOOR  # where it starts
            largest = 0
            async with asyncio.timeout(60):
                while len(receiver.deliveries()) < total:
                    largest = max(largest, worker.capacity.limit)
                    await asyncio.sleep(0.05)
            shown = metric(worker, "webhooks_worker_capacity")
    # Far more than a fixed 64 (the windows of 300 subscriptions allow 600)...
    assert most["all"] >= 3 * FLOOR, (most, largest, worker.capacity.bound)
    assert largest >= most["all"] and shown >= FLOOR
    # ... and no owner past half of the capacity it had at its largest.
    for owner in OWNERS:
        assert most[owner] <= largest // 2, (owner, most, largest)
