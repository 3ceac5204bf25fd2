"""Another owner's own backlog drains beside one owner's larger, older queue, not behind
it: the worker's lane for other queues (others_due) finds the other owner's queue, and
each claim goes on taking from it, up to its subscription's window, while it has due
deliveries. With only the first due delivery of each queue per walk of the lane, its 300
deliveries went about five a second, after all 20,000 of the first owner's."""

from __future__ import annotations

import psycopg
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from service.worker.fanout import drain_outbox
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import running_worker

QUEUED = 20_000
OTHER = 300


async def test_another_owners_backlog_drains_beside_a_larger_older_queue(
        db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    async with Receiver() as big, Receiver() as small:
        subscribe(conn, big.url, events=["invoice.create"], owner="a")
        conn.execute("INSERT INTO invoices (number, customer, amount)"
                     " SELECT 'A' || g, 'c', 1 FROM generate_series(1, %s) g", (QUEUED,))
        await drain_outbox(Store(pool), 10_000)
        subscribe(conn, small.url, events=["invoice.update"], owner="b")
        async with running_worker(db_url, concurrency=16):
            await big.wait_for(lambda r: len(r.deliveries()) >= 50, timeout=30)
            conn.execute("UPDATE invoices SET amount = amount + 1"
                         " WHERE id IN (SELECT id FROM invoices ORDER BY id LIMIT %s)",
                         (OTHER,))
            await small.wait_for(lambda r: len(r.deliveries()) == OTHER, timeout=120)
            before = len(big.deliveries())
    # b's subscription keeps its turn while it has due deliveries: its whole backlog went
    # while 620-730 of a's did here; with one head per walk of the lane, all 20,000 of
    # a's went first.
    assert before < QUEUED // 2, before
