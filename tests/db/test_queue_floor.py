"""The queue's floor (webhooks.queue_floor, sql/partitions.sql): a time before which no
delivery is pending, raised by the workers to the oldest day holding one (never past
yesterday's start), lowered by redeliver and recover; the claim passes it on, reads only
the partitions from it, and claims nothing when it was lowered since the worker read it."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime

import psycopg

from service.store import Store
from service.store.worker import ClaimParams
from service.worker.delivery import Claim
from service.worker.pacing import claim_params
from tests.db.test_partitions import (
    CLAIM_ALL,
    partitions,
    prepare,
    queue_settings,
    seed_day,
    seeded,
    seeded_db,
    subscription,
)
from tests.support.worker import open_pool, running_worker

__all__ = ["seeded", "seeded_db"]  # the fixtures, for the plan's test


def floor(conn: psycopg.Connection) -> datetime | None:
    row = conn.execute("SELECT nullif(since, '-infinity') FROM webhooks.queue_floor"
                       ).fetchone()
    assert row is not None
    return row[0]


def refresh(conn: psycopg.Connection) -> datetime:
    row = conn.execute("SELECT webhooks.refresh_queue_floor()").fetchone()
    assert row is not None
    return row[0]


def day_start(conn: psycopg.Connection, days_ago: int) -> datetime:
    row = conn.execute("SELECT date_trunc('day', now() - make_interval(days => %s), 'UTC')",
                       (days_ago,)).fetchone()
    assert row is not None
    return row[0]


def test_the_floor_is_the_oldest_day_holding_a_pending_delivery(
        conn: psycopg.Connection) -> None:
    sid = subscription(conn)
    assert floor(conn) is None  # '-infinity' until the first refresh: every day is read
    seed_day(conn, sid, 9, 5)
    seed_day(conn, sid, 6, 3, status="pending")
    seed_day(conn, sid, 3, 5)
    assert refresh(conn) == floor(conn) == day_start(conn, 6)
    conn.execute("UPDATE webhooks.deliveries SET status = 'failed', finished_at = now()"
                 " WHERE status = 'pending'")
    # Nothing pending: the start of yesterday, never later (a transaction still inserting
    # deliveries dated before midnight is not left below it).
    assert refresh(conn) == floor(conn) == day_start(conn, 1)
    # redeliver lowers it to the delivery's time, in its transaction.
    row = conn.execute("SELECT id, created_at FROM webhooks.deliveries"
                       " ORDER BY created_at LIMIT 1").fetchone()
    assert row is not None
    conn.execute("SELECT webhooks.redeliver(%s)", (row[0],))
    assert floor(conn) == row[1]
    assert refresh(conn) == day_start(conn, 9)
    conn.execute("UPDATE webhooks.deliveries SET status = 'failed', finished_at = now()"
                 " WHERE status = 'pending'")
    assert refresh(conn) == day_start(conn, 1)
    # recover lowers it to the oldest (failed) delivery it requeued.
    assert conn.execute("SELECT webhooks.recover(%s, now() - interval '7 days')",
                        (sid,)).fetchone() == (3,)  # day 6's, failed above
    oldest = conn.execute("SELECT min(created_at) FROM webhooks.deliveries"
                          " WHERE status = 'pending'").fetchone()
    assert oldest is not None and floor(conn) == oldest[0]
    # A recover that requeues nothing leaves it.
    conn.execute("SELECT webhooks.recover(%s, now() - interval '1 day')", (sid,))
    assert floor(conn) == oldest[0]
    # A row deleted by hand is made again by the next refresh.
    conn.execute("DELETE FROM webhooks.queue_floor")
    assert refresh(conn) == floor(conn) == day_start(conn, 6)


async def test_a_claim_past_a_lowered_floor_claims_nothing_until_the_floor_is_read(
        db_url: str, conn: psycopg.Connection) -> None:
    """A worker's floor is above a delivery redelivered since: its claim takes nothing
    (not even the fresh delivery, which it could take without breaking the queue's order),
    and next_due gives it the floor under which the claim then takes both."""
    sid = subscription(conn)
    seed_day(conn, sid, 5, 1)
    seed_day(conn, sid, 0, 1, status="pending")
    since = refresh(conn)
    assert since == day_start(conn, 1)
    row = conn.execute("SELECT id, created_at FROM webhooks.deliveries"
                       " ORDER BY created_at LIMIT 1").fetchone()
    assert row is not None
    old, created = row
    conn.execute("SELECT webhooks.redeliver(%s)", (old,))
    async with open_pool(db_url) as pool:
        store = Store(pool)

        def params(since: datetime | None) -> ClaimParams:
            return claim_params(limit=10, per_target=10, busy={}, lease=60.0, scan=100,
                                since=since)

        assert await store.claim(Claim, params(since)) == []
        wait, lowered = await store.next_due(saturated=[], saturated_owners=[])
        assert wait is not None and wait <= 0
        assert lowered == created
        claimed = await store.claim(Claim, params(lowered))
        assert len(claimed) == 2 and old in {c.id for c in claimed}


def test_the_claim_reads_no_partition_before_the_floor(seeded: psycopg.Connection) -> None:
    """Seven days of deliveries, the pending ones yesterday's: with the floor, the claim's
    plan starts with no partition before yesterday's (they are left out when it starts; the
    scans of the due deliveries leave out the days ahead too), and claims as many."""
    conn = seeded
    since = refresh(conn)
    assert since == day_start(conn, 1)
    queue_settings(conn)
    claim = prepare(conn, "claim", CLAIM_ALL | {"since": since})
    with conn.transaction(force_rollback=True):
        text = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) " + claim).fetchall())
    scans = re.findall(r"Scan .*? on (deliveries_p\d+) ", text)
    rows = conn.execute("SELECT partition FROM webhooks.queue_partitions"
                        " WHERE parent = 'deliveries' AND lower_bound < %s", (since,)).fetchall()
    before = {r[0] for r in rows}
    assert len(before) >= 7 and len(partitions(conn, "deliveries")) >= 10
    assert scans and not before & set(scans), text
    due = re.findall(r"Scan using \w+_next_attempt_at_id_idx on (deliveries_p\d+) ", text)
    assert len(due) == 2, text  # yesterday's and today's due index
    assert "rows=100 " in text.splitlines()[0], text


async def test_a_worker_sends_a_delivery_redelivered_below_its_floor_at_once(
        db_url: str, conn: psycopg.Connection) -> None:
    """The worker has read the floor (yesterday's start); a delivery of five days ago is
    redelivered: it is claimed at once, not at the worker's next refresh of the floor."""
    sid = subscription(conn)
    seed_day(conn, sid, 5, 1)
    row = conn.execute("SELECT id, created_at FROM webhooks.deliveries").fetchone()
    assert row is not None
    old, created = row
    async with running_worker(db_url) as worker:
        deadline = time.monotonic() + 10
        while worker.pacing.since is None or worker.pacing.since <= created:
            assert time.monotonic() < deadline, "the worker did not read the floor"
            await asyncio.sleep(0.02)
        conn.execute("SELECT webhooks.redeliver(%s)", (old,))
        deadline = time.monotonic() + 4  # the next refresh comes 5 s after the last
        while conn.execute("SELECT attempts FROM webhooks.deliveries WHERE id = %s",
                           (old,)).fetchone() == (0,):
            assert time.monotonic() < deadline, "the redelivered delivery was not claimed"
            await asyncio.sleep(0.02)
        assert worker.pacing.since is not None and worker.pacing.since <= created
