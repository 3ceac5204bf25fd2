"""The registry the capture probes (webhooks.subscription_events): exact under every kind
of subscription write, an index lookup whatever the number of subscriptions, and the
activation snapshot that keeps changes from before an activation away from it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe_many, subscribe_to
from tests.support.worker import open_pool


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with open_pool(db_url, max_size=4) as p:
        yield p


def registry(conn: psycopg.Connection) -> list[tuple[int, str, str, str | None]]:
    return [tuple(r) for r in conn.execute(  # type: ignore[misc]
        "SELECT subscription_id, event, resource, tenant FROM webhooks.subscription_events "
        "ORDER BY subscription_id, event").fetchall()]


def wanted(conn: psycopg.Connection) -> dict[str, int]:
    return {r[0]: r[1] for r in conn.execute(
        "SELECT event, subscriptions FROM webhooks.wanted_events WHERE subscriptions > 0"
        ).fetchall()}


def delivered_numbers(conn: psycopg.Connection, subscription_id: int) -> list[str]:
    rows = conn.execute(
        "SELECT e.body FROM webhooks.deliveries d JOIN webhooks.events e ON e.id = d.event_id"
        " WHERE d.subscription_id = %s ORDER BY d.id", (subscription_id,)).fetchall()
    return [json.loads(r[0])["resource"]["number"] for r in rows]


def insert_invoice(conn: psycopg.Connection, number: str) -> None:
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES (%s, 'c', 1)",
                 (number,))


def test_the_registry_follows_every_subscription_write(conn: psycopg.Connection) -> None:
    a = subscribe_to(conn, "invoices", ["invoice.create", "invoice.create", "payment.update"],
                     tenant="t1")
    b = subscribe_to(conn, "invoices", ["invoice.delete"], active=False)
    assert registry(conn) == [(a, "invoice.create", "invoices", "t1"),
                              (a, "payment.update", "invoices", "t1")]
    assert wanted(conn) == {"invoice.create": 1, "payment.update": 1}
    conn.execute("UPDATE webhooks.subscriptions SET events = '{invoice.update}' WHERE id = %s",
                 (a,))
    conn.execute("UPDATE webhooks.subscriptions SET active = true WHERE id = %s", (b,))
    assert registry(conn) == [(a, "invoice.update", "invoices", "t1"),
                              (b, "invoice.delete", "invoices", None)]
    c = subscribe_to(conn, "invoices", ["invoice.update"])
    assert wanted(conn) == {"invoice.update": 2, "invoice.delete": 1}
    conn.execute("DELETE FROM webhooks.subscriptions WHERE id = %s", (c,))
    # The recorder's update of last_* fields leaves the registry alone; a 410 removes.
    conn.execute("UPDATE webhooks.subscriptions SET last_status = 500, active = active")
    conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s", (a,))
    conn.execute("DELETE FROM webhooks.subscriptions WHERE id = %s", (b,))
    assert registry(conn) == []
    assert wanted(conn) == {}


async def test_a_change_committed_while_paused_is_never_delivered(
        conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    sub = subscribe_to(conn, "invoices", ["invoice.create"])
    other = subscribe_to(conn, "invoices", ["invoice.create"])  # keeps the event captured
    insert_invoice(conn, "before pause")
    conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s", (sub,))
    insert_invoice(conn, "while paused")
    conn.execute("UPDATE webhooks.subscriptions SET active = true WHERE id = %s", (sub,))
    insert_invoice(conn, "after resume")
    # No worker ran meanwhile: fan-out sees all three at once, after the resume.
    await drain_outbox(Store(pool), 100)
    assert delivered_numbers(conn, sub) == ["after resume"]
    assert delivered_numbers(conn, other) == ["before pause", "while paused", "after resume"]


async def test_a_change_committed_before_a_subscription_existed_is_not_delivered(
        conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    subscribe_to(conn, "invoices", ["invoice.create"])
    insert_invoice(conn, "old")
    late = subscribe_to(conn, "invoices", ["invoice.create"])
    insert_invoice(conn, "new")
    await drain_outbox(Store(pool), 100)
    assert delivered_numbers(conn, late) == ["new"]


async def test_settling_waits_for_writers_that_probed_before_the_subscription(
        db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    with psycopg.connect(db_url) as writer:
        # Nobody subscribes yet: this writer's probe skips, and its transaction stays open.
        insert_invoice(writer, "probed before")
        sub = subscribe_to(conn, "invoices", ["invoice.create"])
        settled = conn.execute("SELECT webhooks.settle_subscription(%s, '50ms')",
                               (sub,)).fetchone()
        assert settled == (False,)  # the writer is still open: the caller is told
        insert_invoice(writer, "probed before, second statement")
        writer.commit()
    assert conn.execute("SELECT webhooks.settle_subscription(%s, '5s')",
                        (sub,)).fetchone() == (True,)
    insert_invoice(conn, "after")
    await drain_outbox(Store(pool), 100)
    # The writer committed before the subscription was settled: its changes count as
    # before the subscription, consistently (none was captured, none is owed).
    assert delivered_numbers(conn, sub) == ["after"]


async def test_a_transaction_older_than_the_subscription_is_captured_when_it_writes_after(
        db_url: str, conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    with psycopg.connect(db_url) as writer:
        writer.execute("SELECT 1")  # the transaction is open before the subscription
        sub = subscribe_to(conn, "invoices", ["invoice.create"])
        assert conn.execute("SELECT webhooks.settle_subscription(%s)",
                            (sub,)).fetchone() == (True,)
        insert_invoice(writer, "written after")
        writer.commit()
    await drain_outbox(Store(pool), 100)
    assert delivered_numbers(conn, sub) == ["written after"]


def test_the_probe_reads_one_row_whatever_the_number_of_subscriptions(
        conn: psycopg.Connection) -> None:
    subscribe_many(conn, 20000, resource="invoices", events=["invoice.create"], owners=20000,
                   target="http://x/")
    conn.execute("ANALYZE webhooks.subscription_events")
    assert conn.execute("SELECT subscriptions FROM webhooks.wanted_events "
                        "WHERE resource = 'invoices' AND event = 'invoice.create'"
                        ).fetchone() == (20000,)
    # One row per (resource, event): the probe reads one row, whatever its plan.
    assert conn.execute("SELECT count(*) FROM webhooks.wanted_events").fetchone() == (1,)
    # A statement on the table whose event nobody wants writes nothing.
    conn.execute("INSERT INTO invoices (id, number, customer, amount) VALUES (1, 'a', 'b', 1)")
    conn.execute("TRUNCATE webhooks.outbox")
    conn.execute("UPDATE invoices SET amount = 2 WHERE id = 1")
    assert conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone() == (0,)


async def test_fan_out_matches_tenants_through_the_index(
        conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    subscribe_many(conn, 2000, resource="invoices", events=["invoice.create"],
                   target="http://x/")
    mine = subscribe_to(conn, "invoices", ["invoice.create"], tenant="acme")
    everyone = subscribe_to(conn, "invoices", ["invoice.create"])
    insert_invoice(conn, "acme's")
    await drain_outbox(Store(pool), 100)
    assert delivered_numbers(conn, mine) == ["acme's"]
    assert delivered_numbers(conn, everyone) == ["acme's"]
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries").fetchone() == (2,)
    conn.execute("ANALYZE webhooks.subscription_events")
    plan = "\n".join(r[0] for r in conn.execute(
        "EXPLAIN (COSTS OFF) SELECT se.subscription_id FROM webhooks.subscription_events se "
        "WHERE se.resource = 'invoices' AND se.event = 'invoice.create' "
        "AND se.tenant = 'acme'").fetchall())
    assert "subscription_events_match_idx" in plan, plan


def test_registry_writes_take_the_count_rows_in_one_order(conn: psycopg.Connection,
                                                         db_url: str) -> None:
    """Two writes to subscriptions of the same events (activations settling together)
    change the same webhooks.wanted_events rows: each takes them in (resource, event)
    order, so while it waits for the first it holds none of the later ones, and two of
    them cannot deadlock (they did, in whatever order each one's join met the rows)."""
    sid = subscribe_to(conn, "invoices", ["invoice.create", "invoice.update"])
    # The first row in key order now lies after the other in the table.
    conn.execute("UPDATE webhooks.wanted_events SET subscriptions = subscriptions"
                 " WHERE event = 'invoice.create'")
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url) as prober:
        holder.execute("SELECT 1 FROM webhooks.wanted_events"
                       " WHERE event = 'invoice.create' FOR UPDATE")
        writer = psycopg.connect(db_url, autocommit=True)
        pid = writer.info.backend_pid
        done = threading.Thread(target=writer.execute, args=(
            "UPDATE webhooks.subscriptions SET active_since = pg_current_snapshot()"
            " WHERE id = %s", (sid,)))
        done.start()
        try:
            deadline = time.monotonic() + 10
            while conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                               (pid,)).fetchone() != ("Lock",):
                assert time.monotonic() < deadline, "the write never waited for the row"
                time.sleep(0.01)
            # Waiting for the first row, the write holds none of the later ones.
            prober.execute("SELECT 1 FROM webhooks.wanted_events"
                           " WHERE event = 'invoice.update' FOR UPDATE NOWAIT")
            prober.rollback()
        finally:
            holder.rollback()
            done.join(10)
            writer.close()
    assert not done.is_alive()
    assert wanted(conn) == {"invoice.create": 1, "invoice.update": 1}
