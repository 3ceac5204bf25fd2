"""Once a backlog is drained, the worker vacuums the deliveries partitions being filled:
each delivery left dead entries in the queue's due index that every claim would walk past
until autovacuum came."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from service.worker import pacing, upkeep
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, maintained, metric, poll, running_worker

ROWS = 300
VACUUM_AFTER_LOAD = 20


async def test_a_drained_backlog_is_vacuumed(db_url: str, conn: psycopg.Connection,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upkeep, "VACUUM_AFTER", 100)
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


async def test_a_steady_load_is_vacuumed_while_it_lasts(
        db_url: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """The vacuum starts when a claim, or a quiet queue's leasing fan-out, finds nothing
    more to claim, whether or not it came back empty. Under a steady load each fresh change
    is leased by its fan-out and no claim comes back empty for as long as the load lasts:
    right after a 20,000-event backlog, every fan-out's probe of the due index walked the
    backlog's entries (7 ms instead of 1) until a lifecycle round's claim came back empty
    and the partition was vacuumed, 2 to 3.5 s later."""
    monkeypatch.setattr(upkeep, "VACUUM_AFTER", VACUUM_AFTER_LOAD)
    # Nothing else asks for a claim while the test runs: no lifecycle round, and no recheck
    # after a leasing fan-out.
    monkeypatch.setattr(upkeep, "lifecycle_interval", lambda settings: 3600.0)
    monkeypatch.setattr(pacing, "RECHECK_MIN", 3600.0)
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        before = maintained(conn, "vacuum_count")
        async with running_worker(db_url) as worker:
            # A change every 20 ms until the partition is vacuumed.
            sent = 0
            deadline = time.monotonic() + 15
            while maintained(conn, "vacuum_count") == before:
                assert time.monotonic() < deadline, "not vacuumed while the load went on"
                add_invoice(conn, f"L-{sent}")
                sent += 1
                await asyncio.sleep(0.02)
            await receiver.wait_for(lambda r: len(r.deliveries()) == sent, timeout=30)
            # The load went to the worker leased by its fan-outs, not claimed.
            assert metric(worker, "webhooks_worker_deliveries_leased_by_fanout_total") \
                >= VACUUM_AFTER_LOAD
