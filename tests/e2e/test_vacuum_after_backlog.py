"""Once a backlog is drained, the worker vacuums the deliveries partitions being filled:
each delivery left dead entries in the queue's due index that every claim would walk past
until autovacuum came."""

from __future__ import annotations

import psycopg
import pytest

from service.worker import loop
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import maintained, poll, running_worker

ROWS = 300


async def test_a_drained_backlog_is_vacuumed(db_url: str, conn: psycopg.Connection,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "VACUUM_AFTER", 100)
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        before = maintained(conn, "vacuum_count")
        with conn.transaction():
            conn.execute(
                "INSERT INTO invoices (number, customer, amount, company_id)"
                " SELECT 'V-' || g, 'c', 10, 'acme' FROM generate_series(1, %s) g", (ROWS,))
        async with running_worker(db_url):
            await receiver.wait_for(lambda r: len(r.deliveries()) == ROWS, timeout=60)
            await poll(lambda: maintained(conn, "vacuum_count") > before, timeout=30,
                       what="the drained backlog's partition vacuumed")
    # Every delivery was made and none is left pending.
    row = conn.execute("SELECT count(*) FILTER (WHERE status = 'pending'), count(*)"
                       " FROM webhooks.deliveries").fetchone()
    assert row == (0, ROWS)
