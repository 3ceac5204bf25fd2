"""Strict ordering's parked queue (sql/ordering.sql) in the database alone, without a
worker: migration 0014 parks the queues that exist before it, a recorder finishing a head
waits for the fan-out parking a delivery behind it and then unparks that delivery, and a
backfill's batch waits parked behind the live head (the queue delivered by a worker:
tests/e2e/test_strict_parking.py)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psycopg

from service import db
from service.worker.fanout import fanout_params
from tests.support.strict import invoices, queue, strict
from tests.support.subscriptions import subscribe


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
