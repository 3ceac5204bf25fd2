"""A backlog in the outbox is fanned out beside the worker's claims: the first deliveries
go out while later statements are still being fanned out, in event order."""

from __future__ import annotations

import psycopg

from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import metric, running_worker

STATEMENTS = 100
ROWS = 40  # per statement: 4,000 changes, one delivery each


async def test_a_backlog_is_sent_while_it_is_fanned_out(db_url: str,
                                                        conn: psycopg.Connection) -> None:
    async with Receiver() as receiver:
        sid, _ = subscribe(conn, receiver.url)
        # Captured before the worker starts: the outbox holds the whole backlog.
        with conn.transaction():
            for s in range(STATEMENTS):
                conn.execute(
                    "INSERT INTO invoices (number, customer, amount, company_id)"
                    " SELECT %s || '-' || g, 'c', 10, 'acme' FROM generate_series(1, %s) g",
                    (f"S{s}", ROWS))
        async with running_worker(db_url) as worker:
            await receiver.wait_for(lambda r: len(r.deliveries()) == STATEMENTS * ROWS,
                                    timeout=60)
            fanouts = metric(worker, "webhooks_worker_db_round_trips_total")
    # Many fan-outs of a few statements, not one of all 100 (whose deliveries would all
    # be created in one transaction, before any was sent) ...
    row = conn.execute(
        "SELECT count(DISTINCT created_at), count(*) FROM webhooks.deliveries"
        " WHERE subscription_id = %s", (sid,)).fetchone()
    assert row is not None and row[1] == STATEMENTS * ROWS and row[0] >= 4, (row, fanouts)
    # ... and attempts began before the last of them: sending did not wait for the rest.
    early = conn.execute(
        "SELECT count(*) FROM webhooks.attempts"
        " WHERE attempted_at < (SELECT max(created_at) FROM webhooks.deliveries)").fetchone()
    assert early is not None and early[0] > 0
    # Each event once, and each attempt started after every earlier event's.
    late = conn.execute(
        "SELECT count(*) FILTER (WHERE attempted_at < before), count(DISTINCT delivery_id)"
        " FROM (SELECT a.attempted_at, a.delivery_id, max(a.attempted_at) OVER ("
        "         ORDER BY d.event_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)"
        "         AS before"
        "       FROM webhooks.attempts a JOIN webhooks.deliveries d ON d.id = a.delivery_id"
        "      WHERE a.attempt = 1) x").fetchone()
    assert late == (0, STATEMENTS * ROWS)
