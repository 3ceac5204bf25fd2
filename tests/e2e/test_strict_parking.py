"""Strict ordering's parked queue (sql/ordering.sql) with a worker delivering it: the
deliveries behind a strict subscription's head wait out of the due range, so that no claim
reads them, and each path that ends a head, deactivates a subscription or requeues
deliveries leaves exactly the right one due; a head left parked comes due in the lifecycle
round (the upgrade's parking, the recorder's wait for a fan-out parking behind its head and
a backfill's batch, in the database alone: tests/db/test_strict_parking.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import psycopg
import pytest

from service import db
from tests.support.receivers import Received, Receiver, echo_secret, status
from tests.support.strict import invoices, queue, strict
from tests.support.subscriptions import subscribe
from tests.support.worker import poll, running_worker

HELD = 30.0  # a retry this far off keeps a failed head pending for the whole test


def count(conn: psycopg.Connection, sid: int, status: str) -> int:
    row = conn.execute("SELECT count(*) FROM webhooks.deliveries"
                       " WHERE subscription_id = %s AND status = %s", (sid, status)).fetchone()
    assert row is not None
    return int(row[0])


def held(conn: psycopg.Connection, sid: int, total: int) -> bool:
    """The subscription's `total` deliveries are queued and its head has been tried."""
    q = queue(conn, sid)
    return len(q) == total and q[0][2] >= 1


def event_ids(received: list[Received]) -> list[int]:
    return [json.loads(r.body)["event"]["id"] for r in received if r.body]


async def test_a_held_queue_waits_parked_and_drains_in_order_once_the_head_passes(
        db_url: str, conn: psycopg.Connection) -> None:
    async with Receiver(behaviour=status(503)) as target, Receiver() as other:
        sid = strict(conn, target.url)
        unordered, _ = subscribe(conn, other.url, events=["invoice.create"])
        async with running_worker(db_url, retry_schedule=(HELD, HELD)):
            invoices(conn, 30, "A-")  # one statement: parked behind the batch's first
            for n in range(10):  # one commit each: parked behind the pending head
                invoices(conn, 1, f"B{n}-")
            await poll(lambda: held(conn, sid, 40), what="40 queued behind a tried head")
            q = queue(conn, sid)
            assert [due for _, due, _ in q] == [True] + [False] * 39
            await poll(lambda: count(conn, unordered, "succeeded") == 40,
                       what="the unordered subscription's 40")
            assert conn.execute("SELECT count(*) FROM webhooks.deliveries"
                                " WHERE next_attempt_at = 'infinity'"
                                " AND subscription_id <> %s", (sid,)).fetchone() == (0,)
            # The delivery log shows no next attempt for a parked delivery.
            shown = conn.execute(db.query("deliveries_get"),
                                 {"id": q[1][0], "subscription_id": sid}).fetchone()
            assert shown is not None and shown[1:7] == (
                "invoice.create", shown[2], "pending", 0, shown[5], None)
            target.behaviour = echo_secret
            conn.execute("SELECT webhooks.redeliver(%s)", (q[0][0],))
            await poll(lambda: count(conn, sid, "succeeded") == 40, timeout=30,
                       what="the strict queue drained")
        ids = event_ids(target.deliveries())
    assert ids[-40:] == sorted(ids[-40:]) and len(set(ids)) == 40


async def test_deactivation_unparks_and_the_claim_closes_the_whole_queue(
        db_url: str, conn: psycopg.Connection) -> None:
    async with Receiver(behaviour=status(503)) as target:
        sid = strict(conn, target.url)
        async with running_worker(db_url, retry_schedule=(HELD, HELD)):
            invoices(conn, 25, "A-")
            await poll(lambda: held(conn, sid, 25), what="25 queued behind a tried head")
            conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s",
                         (sid,))
            assert all(due for _, due, _ in queue(conn, sid))
            # Due now, except the head (its retry is far off): the claim closes them.
            await poll(lambda: count(conn, sid, "failed") >= 24, what="24 closed as failed")


async def test_a_head_left_parked_comes_due_in_the_lifecycle_round(
        db_url: str, conn: psycopg.Connection) -> None:
    """A recorder that died between its record and its unpark leaves the next delivery
    parked with nothing ahead of it: the lifecycle round unparks it."""
    async with Receiver(behaviour=status(503)) as target:
        sid = strict(conn, target.url)
        # Lifecycle rounds every 0.1 s (a quarter of failing_after).
        async with running_worker(db_url, retry_schedule=(HELD, HELD), failing_after=0.4,
                                  disable_after=0):
            invoices(conn, 10, "A-")
            await poll(lambda: held(conn, sid, 10), what="10 queued behind a tried head")
            target.behaviour = echo_secret
            conn.execute("UPDATE webhooks.deliveries SET status = 'succeeded',"
                         " finished_at = now() WHERE id = %s", (queue(conn, sid)[0][0],))
            await poll(lambda: count(conn, sid, "succeeded") == 10,
                       what="the nine behind it, unparked by the lifecycle round")
        ids = event_ids(target.deliveries())
    assert ids[-9:] == sorted(ids[-9:])


async def test_recovered_deliveries_wait_parked_behind_the_first(
        db_url: str, conn: psycopg.Connection) -> None:
    async with Receiver(behaviour=status(503)) as target:
        sid = strict(conn, target.url)
        async with running_worker(db_url, retry_schedule=(0.05,)):
            invoices(conn, 8, "A-")
            await poll(lambda: count(conn, sid, "failed") == 8, what="eight failed for good")
        target.behaviour = echo_secret
        assert conn.execute("SELECT webhooks.recover(%s, now() - interval '1 hour')",
                            (sid,)).fetchone() == (8,)
        assert [due for _, due, _ in queue(conn, sid)] == [True] + [False] * 7
        async with running_worker(db_url):
            await poll(lambda: count(conn, sid, "succeeded") == 8, what="eight recovered")
        ids = event_ids(target.deliveries())
    assert ids[-8:] == sorted(ids[-8:])


@pytest.mark.parametrize("writers", [4])
async def test_writers_racing_the_recorder_never_leave_a_head_parked(
        writers: int, db_url: str, conn: psycopg.Connection) -> None:
    """Single-row commits from several connections while the worker records heads: each
    commit's fan-out parks behind a head that a recorder may be finishing. A head parked
    with nothing ahead of it for a second (the lifecycle round, every 5 s here, would
    hide it later) means the protocol lost a race."""
    per_writer = 50
    total = writers * per_writer
    async with Receiver() as target:
        sid = strict(conn, target.url)
        stuck: list[tuple[int, float]] = []
        stop = threading.Event()

        def write(n: int) -> None:
            with psycopg.connect(db_url, autocommit=True) as c:
                for i in range(per_writer):
                    invoices(c, 1, f"W{n}-{i}-")

        def watch() -> None:
            parked_since: dict[int, float] = {}
            with psycopg.connect(db_url, autocommit=True) as c:
                while not stop.is_set():
                    row = c.execute(
                        "SELECT id, next_attempt_at = 'infinity' FROM webhooks.deliveries"
                        " WHERE subscription_id = %s AND status = 'pending'"
                        " ORDER BY id LIMIT 1", (sid,)).fetchone()
                    now = time.monotonic()
                    if row and row[1]:
                        since = parked_since.setdefault(row[0], now)
                        if now - since > 1.0:
                            stuck.append((row[0], now - since))
                            return
                    time.sleep(0.02)

        async with running_worker(db_url):
            watcher = asyncio.create_task(asyncio.to_thread(watch))
            try:
                await asyncio.gather(*(asyncio.to_thread(write, n) for n in range(writers)))
                await poll(lambda: count(conn, sid, "succeeded") == total or bool(stuck),
                           timeout=60, what=f"{total} delivered")
            finally:
                stop.set()
                await watcher
        assert not stuck, f"a head stayed parked: {stuck}"
        ids = event_ids(target.deliveries())
    assert ids == sorted(ids) and len(ids) == total
