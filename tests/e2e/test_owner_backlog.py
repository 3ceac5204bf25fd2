"""One owner's large due queue does not stand before another owner's deliveries: the
claim reads the queue oldest first, and without the worker's lane for other queues
(others_due, pacing.Lane) the other owner's fresh change waited until every older
delivery of the first had gone out, and its own backlog went one delivery per walk of
the lane (about five a second), after all of them too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from tests.support.fanout import drain_outbox
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, running_worker

QUEUED = 20_000
OTHER = 300


@asynccontextmanager
async def behind_a_large_queue(db_url: str, conn: psycopg.Connection,
                               pool: AsyncConnectionPool, events: list[str]
                               ) -> AsyncIterator[tuple[Receiver, Receiver]]:
    """Owner a's QUEUED due deliveries, owner b's subscription to `events`, and a worker
    that has begun on a's queue: (a's receiver, b's)."""
    async with Receiver() as big, Receiver() as small:
        subscribe(conn, big.url, events=["invoice.create"], owner="a")
        conn.execute("INSERT INTO invoices (number, customer, amount)"
                     " SELECT 'A' || g, 'c', 1 FROM generate_series(1, %s) g", (QUEUED,))
        await drain_outbox(Store(pool), 10_000)
        subscribe(conn, small.url, events=events, owner="b")
        async with running_worker(db_url, concurrency=16):
            await big.wait_for(lambda r: len(r.deliveries()) >= 50, timeout=30)
            yield big, small


async def test_another_owners_fresh_change_goes_before_a_large_queue(
        db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    async with behind_a_large_queue(db_url, conn, pool, ["invoice.create"]) as (big, small):
        add_invoice(conn, "FRESH")
        await small.wait_for(lambda r: len(r.deliveries()) == 1, timeout=60)
        before = len(big.deliveries())
    # The fresh change went at the next turn of the worker's lane for other queues
    # (pacing.LANE_EVERY: 0.2 s, about 700 deliveries in-process here); without it, all
    # 20,000 went first.
    assert before < QUEUED // 4, before


async def test_another_owners_backlog_drains_beside_a_larger_older_queue(
        db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    async with behind_a_large_queue(db_url, conn, pool, ["invoice.update"]) as (big, small):
        conn.execute("UPDATE invoices SET amount = amount + 1"
                     " WHERE id IN (SELECT id FROM invoices ORDER BY id LIMIT %s)", (OTHER,))
        await small.wait_for(lambda r: len(r.deliveries()) == OTHER, timeout=120)
        before = len(big.deliveries())
    # b's subscription keeps its turn while it has due deliveries (pacing.Lane): its
    # whole backlog went while 620-730 of a's did here; with one delivery per queue per
    # walk of the lane, all 20,000 of a's went first.
    assert before < QUEUED // 2, before
