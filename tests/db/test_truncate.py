"""TRUNCATE of an attached table: one `<noun>.truncate` event per statement, with no row,
to the subscriptions without a tenant that want it; attach and migrate install its
trigger (the API's side: tests/e2e/test_truncate.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, open_pool


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with open_pool(db_url, max_size=4) as p:
        yield p


def deliveries(conn: psycopg.Connection) -> list[tuple[int, str, dict[str, object]]]:
    return [(r[0], r[1], json.loads(r[2])) for r in conn.execute(
        "SELECT d.subscription_id, e.name, e.body FROM webhooks.deliveries d"
        " JOIN webhooks.events e ON e.id = d.event_id ORDER BY d.id").fetchall()]


def test_attach_registers_truncate_and_its_trigger(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE notes (id bigint PRIMARY KEY, body text)")
    conn.execute("SELECT webhooks.attach('notes', resource => 'notes', noun => 'note',"
                 " public => false)")
    assert conn.execute("SELECT event, public FROM webhooks.hook_events"
                        " WHERE resource = 'notes' ORDER BY event").fetchall() == [
        ("note.create", False), ("note.delete", False), ("note.truncate", False),
        ("note.update", False)]
    assert conn.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'notes'::regclass"
                        " ORDER BY tgname").fetchall() == [
        ("webhooks_1_insert",), ("webhooks_2_update",), ("webhooks_3_delete",),
        ("webhooks_4_truncate",)]
    # The example's tables, attached when the migrations ran, have it too.
    assert conn.execute("SELECT count(*) FROM webhooks.hook_events"
                        " WHERE event IN ('invoice.truncate', 'payment.truncate')"
                        ).fetchone() == (2,)
    conn.execute("TRUNCATE notes")  # nobody wants it: nothing is written
    assert conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone() == (0,)
    conn.execute("SELECT webhooks.detach('notes')")
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'notes'::regclass"
                        ).fetchone() == (0,)


async def test_truncate_sends_one_event_without_a_row(conn: psycopg.Connection,
                                                      pool: AsyncConnectionPool) -> None:
    everything, _ = subscribe(conn, events=["invoice.truncate", "invoice.create"])
    subscribe(conn, events=["invoice.create"])
    subscribe(conn, events=["invoice.truncate"], tenant="acme")
    add_invoice(conn, "T1")
    conn.execute("DELETE FROM webhooks.outbox")
    with conn.transaction():
        conn.execute("SET LOCAL webhooks.user_id = '42'")
        conn.execute("TRUNCATE invoices CASCADE")
    conn.execute("TRUNCATE invoices CASCADE")  # empty: a statement all the same

    await drain_outbox(Store(pool), 100)
    sent = deliveries(conn)
    assert [(s, n) for s, n, _ in sent] == [(everything, "invoice.truncate")] * 2
    body = sent[0][2]
    assert set(body) == {"event"}
    event = body["event"]
    assert isinstance(event, dict)
    assert event["name"] == "invoice.truncate"
    assert event["resource"] == "invoices"
    assert event["resource_id"] is None
    assert event["user_id"] == "42"


async def test_truncate_of_a_table_without_tenants_reaches_every_subscription(
        conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    conn.execute("CREATE TABLE notes (id bigint PRIMARY KEY, body text)")
    conn.execute("SELECT webhooks.attach('notes', resource => 'notes', noun => 'note')")
    plain, _ = subscribe(conn, resource="notes", events=["note.truncate"])
    scoped, _ = subscribe(conn, resource="notes", events=["note.truncate"], tenant="acme")
    conn.execute("INSERT INTO notes VALUES (1, 'a')")
    conn.execute("TRUNCATE notes")
    await drain_outbox(Store(pool), 100)
    assert sorted(s for s, _, _ in deliveries(conn)) == sorted([plain, scoped])


def test_an_earlier_attachment_gets_truncate_at_migrate(db_url: str,
                                                        conn: psycopg.Connection) -> None:
    from service import db
    conn.execute("DELETE FROM webhooks.hook_events WHERE event = 'invoice.truncate'")
    # As an earlier version left it (the DDL guard's event triggers, off in a replica
    # session, refuse dropping a capture trigger).
    conn.execute("SET session_replication_role = replica")
    conn.execute("DROP TRIGGER webhooks_4_truncate ON invoices")
    conn.execute("RESET session_replication_role")
    db.migrate(db_url)
    assert conn.execute("SELECT public FROM webhooks.hook_events"
                        " WHERE event = 'invoice.truncate'").fetchone() == (True,)
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'invoices'::regclass"
                        " AND tgname = 'webhooks_4_truncate'").fetchone() == (1,)
