"""Each connection of the worker's queue pool comes with the queue's statements prepared
and planned (Worker.prepare_queue), and preparing one holds no due delivery back. That
the statements have one parameter signature whatever the values (service/store/base.py:
one_signature): tests/db/test_queue_signature.py."""

from __future__ import annotations

import psycopg

from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe
from tests.support.worker import running_worker


async def test_each_queue_connection_comes_with_its_statements_planned(db_url: str) -> None:
    async with running_worker(db_url) as worker, worker.queue.pool.connection() as c:
        rows = await (await c.execute(
            "SELECT statement, generic_plans FROM pg_prepared_statements")).fetchall()
    planned = [text for text, generic in rows if generic >= 1]
    assert any("pg_try_advisory_xact_lock" in t for t in planned), rows  # the fan-out
    assert any("lease_expires_at = CASE" in t for t in planned), rows  # the claim
    assert any("jsonb_array_elements" in t for t in planned), rows  # the record


async def test_preparing_a_connection_holds_no_due_delivery_back(
        db_url: str, conn: psycopg.Connection) -> None:
    # A new connection of the queue pool is prepared while the worker claims on others: a
    # claim of nothing that scanned the due deliveries left the oldest locked for a moment,
    # and a claim beside it started later ones first.
    async with running_worker(db_url) as worker:
        await worker.stop()  # its pools stay open until the block ends
        subscribe(conn)
        conn.execute("INSERT INTO invoices (number, customer, amount, company_id)"
                     " SELECT 'P-' || g, 'c', 1, 'acme' FROM generate_series(1, 20) g")
        await drain_outbox(worker.store, 100)
        # Prepared in one transaction here, as if each statement's locks lasted as long as
        # the preparation.
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as fresh, \
                fresh.transaction():
            await worker.prepare_queue(fresh)
            free = conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM webhooks.deliveries"
                " WHERE status = 'pending' FOR UPDATE SKIP LOCKED) x").fetchone()
            conn.rollback()
    assert free == (20,)
