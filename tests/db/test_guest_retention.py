"""Retention (service/worker/pruning.py) in a guest's database: under hostile defaults
for the database or the service's role, and from sessions with their own time zone, date
style and string syntax (a DBA's psql), a detached partition goes back with its own bounds
and the partition functions answer as from the service's sessions
(tests/support/hostile.py; tests/e2e/test_guest_settings.py runs the API and the worker
under the same defaults)."""

from __future__ import annotations

from datetime import datetime

import psycopg
import pytest
from psycopg.rows import dict_row

from service import db
from service.store import Store
from service.worker.pruning import prune
from tests.support.hostile import (
    WRITER,
    hostile_defaults,  # noqa: F401  (the fixture `hostile`)
)
from tests.support.seeds import requeue_before_the_drop, seed_day
from tests.support.subscriptions import subscribe
from tests.support.worker import open_pool

WEEK = 7 * 86400.0




def deliveries_partitions(conn: psycopg.Connection) -> list[tuple[str, datetime, datetime]]:
    return conn.execute("SELECT partition, lower_bound, upper_bound FROM webhooks.queue_partitions"
                        " WHERE parent = 'deliveries' ORDER BY lower_bound").fetchall()


async def test_retention_under_hostile_defaults_keeps_a_requeued_delivery(
        hostile: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delivery requeued between the choice and the detach: the detached partition goes
    back with its own bounds, and the delivery stays in the queue."""
    sid, _ = subscribe(conn)
    seed_day(conn, sid, 10, 20, attempts=False)
    before = deliveries_partitions(conn)
    chosen = requeue_before_the_drop(conn, monkeypatch)
    async with open_pool(hostile) as pool:
        assert await prune(Store(pool), retention=WEEK) == 0
    assert chosen
    assert deliveries_partitions(conn) == before
    assert conn.execute("SELECT count(*), count(*) FILTER (WHERE status = 'pending')"
                        " FROM webhooks.deliveries").fetchone() == (20, 1)


def test_retention_bounds_go_back_as_they_came_in_any_session(
        db_url: str, conn: psycopg.Connection) -> None:
    """Retention's two queries, run in a session with its own time zone and date style
    (the service's own sessions set theirs): the bounds the first returns put a detached
    partition back exactly where it was."""
    sid, _ = subscribe(conn)
    seed_day(conn, sid, 10, 5, attempts=False)
    before = deliveries_partitions(conn)
    with psycopg.connect(db_url, autocommit=True, options=WRITER) as dba, \
            dba.cursor(row_factory=dict_row) as cur:
        parts = cur.execute(db.query("partitions_expired"), {"retention": WEEK}).fetchall()
        part = next(p for p in parts if p["parent"] == "deliveries")
        conn.execute("SELECT webhooks.redeliver(min(id)) FROM webhooks.deliveries")
        cur.execute(psycopg.sql.SQL("ALTER TABLE webhooks.deliveries DETACH PARTITION {}")
                    .format(psycopg.sql.Identifier("webhooks", part["partition"])))
        kept = cur.execute(db.query("partitions_keep_detached"),
                           {**part, "retention": WEEK}).fetchone()
        assert kept == {"kept": True}
    assert deliveries_partitions(conn) == before
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries WHERE status = 'pending'"
                        ).fetchone() == (1,)


def test_a_dba_session_sees_the_partitions_as_they_are(
        db_url: str, conn: psycopg.Connection) -> None:
    """The retention functions called from a DBA's psql with its own time zone, date
    style and string syntax answer as from the service's sessions."""
    sid, _ = subscribe(conn)
    # Made ten days ago, finished an hour inside the week's retention: the day is busy.
    seed_day(conn, sid, 10, 3, finished_ago="6 days 23 hours", attempts=False)
    name = deliveries_partitions(conn)[0][0]
    conn.execute("SELECT webhooks.ensure_partitions(now(), now() + interval '2 days')")
    count = "SELECT count(*) FROM webhooks.queue_partitions WHERE parent = 'deliveries'"
    made = conn.execute(count).fetchone()
    with psycopg.connect(db_url, autocommit=True, options=WRITER) as dba:
        assert dba.execute("SELECT webhooks.deliveries_partition_busy(%s, now() - interval"
                           " '7 days')", (name,)).fetchone() == (True,)
        assert dba.execute("SELECT count(*) FROM webhooks.expired_partitions('7 days')"
                           " WHERE parent = 'deliveries'").fetchone() == (0,)
        assert dba.execute("SELECT webhooks.ensure_partitions(now(), now() + interval"
                           " '2 days')").fetchone() == (0,)
        assert dba.execute(count).fetchone() == made
