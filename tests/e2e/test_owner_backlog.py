"""One owner's large due queue does not stand before another owner's fresh change: the
claim reads the queue oldest first, and without the worker's lane for other queues
(others_due) the other owner's delivery waited until every older delivery of the first
had gone out."""

from __future__ import annotations

import psycopg
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from service.worker.fanout import drain_outbox
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, running_worker

QUEUED = 20_000


async def test_another_owners_fresh_change_goes_before_a_large_queue(
        db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    async with Receiver() as big, Receiver() as small:
        subscribe(conn, big.url, events=["invoice.create"], owner="a")
        conn.execute("INSERT INTO invoices (number, customer, amount)"
                     " SELECT 'A' || g, 'c', 1 FROM generate_series(1, %s) g", (QUEUED,))
        await drain_outbox(Store(pool), 10_000)
        subscribe(conn, small.url, events=["invoice.create"], owner="b")
        async with running_worker(db_url, concurrency=16):
            await big.wait_for(lambda r: len(r.deliveries()) >= 50, timeout=30)
            add_invoice(conn, "FRESH")
            await small.wait_for(lambda r: len(r.deliveries()) == 1, timeout=60)
            before = len(big.deliveries())
    # The fresh change went at the next turn of the worker's lane for other queues
    # (pacing.LANE_EVERY: 0.2 s, about 700 deliveries in-process here); without it, all
    # 20,000 went first.
    assert before < QUEUED // 4, before
