"""A subscription made inactive with a large queue (paused, its table detached or dropped)
never stands before the others: the claim closes what it meets of that queue within its
caps, and the worker closes the rest of its due deliveries at once, without counting an
attempt, so another owner's fresh delivery is claimed next."""

from __future__ import annotations

import psycopg
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from tests.support.fanout import drain_outbox
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, metric, running_worker

QUEUED = 3_000


async def test_an_inactive_subscriptions_queue_is_closed_at_once(
        db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    dead = subscribe(conn, "http://dead.example/", events=["invoice.create"], owner="a")[0]
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'D' || g, 'c', 1 FROM generate_series(1, %s) g", (QUEUED,))
    await drain_outbox(Store(pool), 10_000)
    conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s", (dead,))
    # A retry not yet due stays for its time (the subscription may be resumed first).
    conn.execute("UPDATE webhooks.deliveries SET next_attempt_at = now() + interval '1 hour'"
                 " WHERE id = (SELECT max(id) FROM webhooks.deliveries)")
    async with Receiver() as receiver:
        subscribe(conn, receiver.url, events=["invoice.create"], owner="b")
        async with running_worker(db_url, concurrency=16) as worker:
            add_invoice(conn, "FRESH")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1, timeout=30)
            closed = metric(worker, "webhooks_worker_deliveries_closed_inactive_total")
    counts = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'failed' AND attempts = 1),"
        "       count(*) FILTER (WHERE status = 'failed' AND attempts = 0),"
        "       count(*) FILTER (WHERE status = 'pending')"
        "  FROM webhooks.deliveries WHERE subscription_id = %s", (dead,)).fetchone()
    assert counts is not None
    by_claim, at_once, pending = counts
    # The claims closed a batch at most (16 slots) before the rest went in one statement;
    # without that, every one was closed by a claim, 16 at a time, before the fresh one.
    assert by_claim <= 16, counts
    assert by_claim + at_once == QUEUED - 1 and pending == 1, counts
    assert closed == at_once
    assert conn.execute("SELECT count(*) FROM webhooks.attempts WHERE subscription_id = %s",
                        (dead,)).fetchone() == (0,)
