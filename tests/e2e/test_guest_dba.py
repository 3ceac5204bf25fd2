"""What a DBA sets with webhooks.attach / detach is what happens: private events and
detached tables stop their subscriptions (saying why, through the API), and the API makes
the day's partitions it needs. That no row means no old row either, that a column sent
again is announced and that a dropped table stops its subscriptions:
tests/db/test_attach.py; that a backfill reads only the attached table:
tests/db/test_backfill_sql.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from service.commands import status
from service.store import Store
from tests.support.api import Api, api_for, assert_error
from tests.support.fanout import drain_outbox
from tests.support.notes import attach, make_notes
from tests.support.subscriptions import subscribe, subscription
from tests.support.worker import open_pool, poll


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with open_pool(db_url, max_size=4) as p:
        yield p


def delivered_to(conn: psycopg.Connection, sid: int) -> int:
    row = conn.execute("SELECT count(*) FROM webhooks.deliveries WHERE subscription_id = %s",
                       (sid,)).fetchone()
    assert row is not None
    return int(row[0])


# --- a. public => false stops existing subscriptions at once --------------------------

async def test_events_made_private_stop_their_subscriptions(
        api: Api, conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    make_notes(conn)
    creates = await api.create("note.create", resource="notes")
    mixed = await api.create("note.create,note.delete", resource="notes")
    invoices = await api.create("invoice.create")
    attach(conn, public=False)

    for sub in (creates, mixed):
        body = (await api.request("GET", f"/api/v1/webhooks/{sub['id']}")).json()
        assert body["active"] is False
        assert "no longer public" in body["inactive_reason"]
        assert "note.create" in body["inactive_reason"]
    assert (await api.request("GET", f"/api/v1/webhooks/{invoices['id']}")).json()[
        "inactive_reason"] is None
    conn.execute("INSERT INTO notes VALUES (1, 'b', 's')")
    conn.execute("DELETE FROM notes")
    await drain_outbox(Store(pool), 100)
    assert delivered_to(conn, creates["id"]) == delivered_to(conn, mixed["id"]) == 0

    response = await api.request("PUT", f"/api/v1/webhooks/{creates['id']}",
                                 json={"active": True})
    assert_error(response, 400, "not public")
    assert subscription(conn, creates["id"])["active"] is False

    # Attached again as private: an operator's subscription to private events goes on.
    operator, _ = subscribe(conn, resource="notes", events=["note.create"], owner="ops")
    attach(conn, public=False)
    assert subscription(conn, operator)["active"] is True

    # Public again: re-activating is the owner's choice, and clears the reason.
    attach(conn)
    response = await api.request("PUT", f"/api/v1/webhooks/{creates['id']}",
                                 json={"active": True})
    assert response.status_code == 200, response.text
    assert response.json()["inactive_reason"] is None


# --- b. detach leaves its subscriptions inactive, saying why ---------------------------

async def test_detach_stops_its_subscriptions_and_says_why(
        api: Api, conn: psycopg.Connection) -> None:
    make_notes(conn)
    notes = await api.create("note.create,note.update", resource="notes")
    both = await api.create("invoice.create,payment.create")
    conn.execute("SELECT webhooks.detach('notes')")

    body = (await api.request("GET", f"/api/v1/webhooks/{notes['id']}")).json()
    assert body["active"] is False
    assert "notes was detached" in body["inactive_reason"]
    listed = (await api.request("GET", "/api/v1/webhooks/?active=false")).json()
    assert [s["inactive_reason"] for s in listed] == [body["inactive_reason"]]

    # A subscription that keeps an event of another table goes on.
    conn.execute("SELECT webhooks.detach('payments')")
    assert subscription(conn, both["id"])["active"] is True

    data = status.collect(conn)
    assert [(s["id"], s["inactive_reason"]) for s in data["stopped"]] == [
        (notes["id"], body["inactive_reason"])]
    assert body["inactive_reason"] in status.render(data)

    script = (await api.http.get("/dashboard/static/app.js")).text
    assert "inactive_reason" in script


# --- c. the API makes the partitions it writes to --------------------------------------

def drop_todays_partitions(conn: psycopg.Connection) -> list[str]:
    names = [r[0] for r in conn.execute(
        "SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent IN ('webhooks.events'::regclass, 'webhooks.deliveries'::regclass)"
        "   AND c.relkind = 'r'").fetchall()]
    for name in names:
        conn.execute(f"DROP TABLE {name}")
    return names


def todays_partitions(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent IN ('webhooks.events'::regclass, 'webhooks.deliveries'::regclass)"
        "   AND c.relname LIKE '%%' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')").fetchone()
    assert row is not None
    return int(row[0])


async def test_a_test_event_without_todays_partitions_makes_them(
        api: Api, conn: psycopg.Connection) -> None:
    sub = await api.create()
    assert drop_todays_partitions(conn)
    assert todays_partitions(conn) == 0
    response = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/test")
    assert response.status_code == 202, response.text
    assert response.json()["event"] == "webhook.test"
    assert todays_partitions(conn) == 2


async def test_the_api_makes_todays_partitions_at_start(db_url: str,
                                                         conn: psycopg.Connection) -> None:
    assert drop_todays_partitions(conn)
    async with api_for(db_url):
        # Made in the background, so that the API binds at once whatever the database does.
        await poll(lambda: todays_partitions(conn) == 2, what="today's partitions")
