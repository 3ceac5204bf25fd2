"""Fan-out: outbox rows become events with one delivery per matching active subscription."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from service.db import conninfo, query
from service.store import Store
from service.worker.fanout import FANOUT_LOCK, fan_out_batch, fanout_params
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe, subscribe_to
from tests.support.worker import add_invoice, open_pool


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with open_pool(db_url, max_size=4) as p:
        yield p


def count(conn: psycopg.Connection, table: str) -> int:
    queries = {
        "outbox": "SELECT count(*) FROM webhooks.outbox",
        "events": "SELECT count(*) FROM webhooks.events",
        "deliveries": "SELECT count(*) FROM webhooks.deliveries",
    }
    row = conn.execute(queries[table]).fetchone()
    assert row is not None
    return int(row[0])


async def test_one_delivery_per_matching_subscription(pool: AsyncConnectionPool,
                                                      conn: psycopg.Connection) -> None:
    a, _ = subscribe(conn, "http://a.example/", events=["invoice.create"])
    b, _ = subscribe(conn, "http://b.example/", events=["invoice.create", "invoice.update"])
    subscribe(conn, "http://c.example/", events=["invoice.delete"])
    subscribe(conn, "http://d.example/", events=["invoice.create"], tenant="globex")
    subscribe(conn, "http://e.example/", events=["invoice.create"], active=False)
    subscribe(conn, "http://f.example/", events=["payment.create"])
    invoice_id = add_invoice(conn, "F1", company="acme")
    conn.execute("UPDATE invoices SET status = 'sent' WHERE id = %s", (invoice_id,))

    assert (await drain_outbox(Store(pool), 100)).created == 3
    assert count(conn, "outbox") == 0
    rows = conn.execute("SELECT e.name, d.subscription_id, d.status, d.attempts"
                        " FROM webhooks.deliveries d JOIN webhooks.events e"
                        " ON e.id = d.event_id ORDER BY d.id").fetchall()
    assert rows == [("invoice.create", a, "pending", 0), ("invoice.create", b, "pending", 0),
                    ("invoice.update", b, "pending", 0)]


async def test_body_is_built_once_in_sql(pool: AsyncConnectionPool,
                                         conn: psycopg.Connection) -> None:
    subscribe(conn, "http://a.example/")
    invoice_id = add_invoice(conn, "B1")
    conn.execute("INSERT INTO payments (invoice_id, amount) VALUES (%s, 2)", (invoice_id,))
    await drain_outbox(Store(pool), 100)
    bodies = [json.loads(b) for (b,) in conn.execute(
        "SELECT body FROM webhooks.events ORDER BY id").fetchall()]
    assert [b["event"]["name"] for b in bodies] == ["invoice.create", "payment.create"]
    invoice, payment = bodies
    assert set(invoice) == {"event", "resource"}
    assert set(invoice["event"]) == {"id", "name", "resource", "resource_id", "user_id",
                                     "occurred_at"}
    assert payment["event"]["parent"] == {"resource": "invoices", "resource_id": invoice_id}
    assert payment["resource"]["invoice_id"] == invoice_id
    assert "card_token" not in payment["resource"]


async def test_unwanted_events_leave_the_hot_tables(pool: AsyncConnectionPool,
                                                    conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn, "http://a.example/")
    add_invoice(conn, "U1")
    # Deactivated after the change was captured but before fan-out.
    conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s", (sid,))
    assert count(conn, "outbox") == 1
    assert (await drain_outbox(Store(pool), 100)).created == 0
    assert (count(conn, "outbox"), count(conn, "events"), count(conn, "deliveries")) == (
        0, 0, 0)


async def test_batches_in_event_order(pool: AsyncConnectionPool,
                                      conn: psycopg.Connection) -> None:
    subscribe(conn, "http://a.example/")
    # One statement of 50 rows, then 200 single-row statements: 201 outbox rows.
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'O' || g, 'c', 1 FROM generate_series(1, 50) g")
    for g in range(51, 251):
        add_invoice(conn, f"O{g}")
    first = await fan_out_batch(Store(pool), 100)
    assert (first.locked, first.taken, first.changes, first.created) == (True, 100, 149, 149)
    assert (await drain_outbox(Store(pool), 100)).created == 101
    rows = conn.execute("SELECT d.event_id, e.body::jsonb -> 'resource' ->> 'number' "
                        "FROM webhooks.deliveries d JOIN webhooks.events e ON e.id = d.event_id "
                        "ORDER BY d.id").fetchall()
    event_ids = [r[0] for r in rows]
    assert event_ids == sorted(event_ids) and len(event_ids) == 250
    assert [r[1] for r in rows] == [f"O{g}" for g in range(1, 251)]


async def test_one_worker_fans_out_at_a_time(pool: AsyncConnectionPool, db_url: str,
                                             conn: psycopg.Connection) -> None:
    subscribe(conn, "http://a.example/")
    add_invoice(conn, "L1")
    with psycopg.connect(db_url) as other, other.transaction():
        other.execute("SELECT pg_advisory_xact_lock(%s)", (FANOUT_LOCK,))
        busy = await fan_out_batch(Store(pool), 100)
        assert (busy.locked, busy.taken) == (False, 0)
    assert (await drain_outbox(Store(pool), 100)).created == 1


async def test_an_oversized_row_is_delivered_without_it_and_flagged(
        db_url: str, conn: psycopg.Connection) -> None:
    subscribe_to(conn, "invoices", ["invoice.create"])
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('small', 'c', 1), "
                 "('big', repeat('x', 5000), 1)")
    async with AsyncConnectionPool(db_url, open=False, kwargs={"autocommit": True}) as pool:
        await drain_outbox(Store(pool), 100, max_row_bytes=2000)
    bodies = [json.loads(r[0]) for r in conn.execute(
        "SELECT body FROM webhooks.events ORDER BY id")]
    assert bodies[0]["resource"]["number"] == "small"
    assert "resource" not in bodies[1] and bodies[1]["resource_omitted"] == "too_large"
    assert bodies[1]["event"]["name"] == "invoice.create"


def test_the_statement_inlines_its_functions(db_url: str, conn: psycopg.Connection) -> None:
    # webhooks.change_rows, json_in_order, event_json and body_member are planned with
    # the statement (and cached with it), not planned again inside each call at every
    # fan-out: a SQL function is inlined only while every name in it is qualified,
    # nothing is SET and its arguments stay cheap, which a later edit can break quietly.
    subscribe(conn, "http://a.example/")
    add_invoice(conn, "I1")
    params = fanout_params(10, 1000)
    with psycopg.connect(conninfo(db_url)) as worker:  # the service's own session settings
        plan = "\n".join(row[0] for row in worker.execute(
            "EXPLAIN (VERBOSE) " + query("fanout"), params).fetchall())
        worker.rollback()
    for name in ("change_rows", "json_in_order", "event_json", "body_member"):
        assert f"webhooks.{name}" not in plan, name
    assert "json_array_elements" in plan  # change_rows' own body, in the plan
