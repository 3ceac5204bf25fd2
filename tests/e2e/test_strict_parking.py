"""Strict ordering's parked queue (sql/ordering.sql): the deliveries behind a strict
subscription's head wait out of the due range, so that no claim reads them, and each
path that ends a head, deactivates a subscription or requeues deliveries leaves exactly
the right one due; a head left parked comes due in the lifecycle round."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import psycopg
import pytest

from service import db
from service.worker.fanout import fanout_params
from tests.support.receivers import Received, Receiver, echo_secret, status
from tests.support.subscriptions import subscribe
from tests.support.worker import poll, running_worker

HELD = 30.0  # a retry this far off keeps a failed head pending for the whole test


def strict(conn: psycopg.Connection, target: str) -> int:
    sid, _ = subscribe(conn, target, events=["invoice.create"])
    conn.execute("UPDATE webhooks.subscriptions SET ordering = 'strict' WHERE id = %s", (sid,))
    return sid


def invoices(conn: psycopg.Connection, count: int, prefix: str) -> None:
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT %s || i, 'c', 1 FROM generate_series(1, %s) i", (prefix, count))


def queue(conn: psycopg.Connection, sid: int) -> list[tuple[int, bool, int]]:
    """(id, due at some time, attempts) of the subscription's pending deliveries, by id."""
    return [(r[0], r[1], r[2]) for r in conn.execute(
        "SELECT id, next_attempt_at < 'infinity', attempts FROM webhooks.deliveries"
        " WHERE subscription_id = %s AND status = 'pending' ORDER BY id", (sid,))]


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


def test_the_upgrade_parks_the_queues_that_exist(conn: psycopg.Connection) -> None:
    """Migration 0014 on a queue made before it: every due delivery behind a strict
    subscription's head is parked; the head, a delivery in flight and an unordered
    subscription's queue are left as they were."""
    sid = strict(conn, "http://127.0.0.1:9/")
    unordered, _ = subscribe(conn, "http://127.0.0.1:9/", events=["invoice.create"])
    conn.execute(
        "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
        "  SELECT nextval('webhooks.event_ids'), 'invoices', 'invoice.create', now(), '{}'"
        "    FROM generate_series(1, 6) RETURNING id)"
        " INSERT INTO webhooks.deliveries (event_id, subscription_id)"
        " SELECT e.id, s FROM e, unnest(%s::bigint[]) AS s ORDER BY e.id, s",
        ([sid, unordered],))
    # The third is in flight (a worker's lease), as a lease that outlived its head can be.
    third = queue(conn, sid)[2][0]
    conn.execute("UPDATE webhooks.deliveries SET lease_expires_at = now() + interval '1 min',"
                 " next_attempt_at = now() + interval '1 min' WHERE id = %s", (third,))
    conn.execute(Path(db.MIGRATIONS_DIR, "0014.strict-parking.sql").read_text())
    assert [due for _, due, _ in queue(conn, sid)] == [True, False, True, False, False, False]
    assert all(due for _, due, _ in queue(conn, unordered))


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


def test_a_recorder_finishing_the_head_waits_for_the_parker_and_unparks_its_delivery(
        db_url: str, conn: psycopg.Connection) -> None:
    """The interleaving the lock is for: a fan-out parks a new delivery behind the head
    and has not committed when a recorder finishes that head. The recorder's update
    waits for the fan-out's commit, so its unpark, a later statement, sees the parked
    delivery and makes it due (without the lock the record would pass, its unpark see
    nothing, and the new head stay parked)."""
    sid = strict(conn, "http://127.0.0.1:9/")
    params = fanout_params(100, 1_000_000)
    invoices(conn, 1, "A-")
    conn.execute(db.query("fanout"), params)
    (head, _, _), = queue(conn, sid)
    created = conn.execute("UPDATE webhooks.deliveries SET attempts = 1,"
                           " lease_expires_at = now() + interval '1 min' WHERE id = %s"
                           " RETURNING created_at", (head,)).fetchone()
    assert created is not None
    batch = json.dumps([[head, 1, sid, 200, "succeeded", None, time.time(), 1.0, None,
                         created[0].isoformat()]])
    invoices(conn, 1, "B-")
    with psycopg.connect(db_url) as parker:
        parker.execute(db.query("fanout"), params)  # open: B is parked, the head locked
        recorder_pid: list[int] = []

        def record() -> None:
            with psycopg.connect(db_url, autocommit=True) as c:
                recorder_pid.append(c.info.backend_pid)
                row = c.execute(db.query("record"), {"batch": batch}).fetchone()
                assert row is not None and row[3] == [sid]
                c.execute(db.query("unpark"), {"subscription_ids": row[3]})

        recorder = threading.Thread(target=record)
        recorder.start()
        deadline = time.monotonic() + 10
        while not (recorder_pid and conn.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                (recorder_pid[0],)).fetchone() == (True,)):
            assert recorder.is_alive() and time.monotonic() < deadline, \
                "the recorder did not wait for the parker's lock on the head"
            time.sleep(0.01)
        parker.commit()
        recorder.join(10)
    assert not recorder.is_alive()
    assert [due for _, due, _ in queue(conn, sid)] == [True]


def test_a_backfill_batch_waits_parked_behind_the_live_head(
        conn: psycopg.Connection) -> None:
    invoices(conn, 6, "OLD-")
    sid = strict(conn, "http://127.0.0.1:9/")
    invoices(conn, 1, "LIVE-")
    conn.execute(db.query("fanout"), fanout_params(100, 1_000_000))
    conn.execute("SELECT webhooks.start_backfill(%s)", (sid,))
    step = conn.execute("SELECT queued FROM webhooks.backfill_step(4, 262144)").fetchone()
    assert step == (4,)
    assert [due for _, due, _ in queue(conn, sid)] == [True, False, False, False, False]
