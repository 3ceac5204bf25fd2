"""Once a backlog is drained, the worker vacuums the deliveries partitions being filled:
each delivery left dead entries in the queue's due index that every claim would walk past
until autovacuum came."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from service.worker import loop
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import running_worker

ROWS = 300


def vacuums(conn: psycopg.Connection) -> int:
    """Manual VACUUMs so far of the deliveries partitions being filled."""
    row = conn.execute(
        "SELECT coalesce(sum(s.vacuum_count), 0) FROM pg_stat_user_tables s"
        "  JOIN webhooks.queue_partitions p ON p.partition = s.relname"
        " WHERE s.schemaname = 'webhooks' AND p.parent = 'deliveries'"
        "   AND p.lower_bound <= now() AND p.upper_bound > now()").fetchone()
    assert row is not None
    return int(row[0])


async def test_a_drained_backlog_is_vacuumed(db_url: str, conn: psycopg.Connection,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "VACUUM_AFTER", 100)
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        before = vacuums(conn)
        with conn.transaction():
            conn.execute(
                "INSERT INTO invoices (number, customer, amount, company_id)"
                " SELECT 'V-' || g, 'c', 10, 'acme' FROM generate_series(1, %s) g", (ROWS,))
        async with running_worker(db_url):
            await receiver.wait_for(lambda r: len(r.deliveries()) == ROWS, timeout=60)
            deadline = time.monotonic() + 30
            while vacuums(conn) == before and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            vacuumed = vacuums(conn) > before
    assert vacuumed, "the drained backlog's partition was not vacuumed"
    # Nothing pending is left behind, and the due index holds no finished delivery.
    row = conn.execute("SELECT count(*) FILTER (WHERE status = 'pending'), count(*)"
                       " FROM webhooks.deliveries").fetchone()
    assert row == (0, ROWS)
