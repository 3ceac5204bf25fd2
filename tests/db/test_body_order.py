"""Delivery bodies keep their documented order: `event` (its members in the documented
order), then `resource` and `previous`, whose members are the row's columns in table
order (jsonb would sort them by length, then name), for captured changes and backfills
alike; the operational events show the subscription in the API's order."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe
from tests.support.worker import open_pool

# Neither alphabetical nor by length, as jsonb would have it.
COLUMNS = ["zeta", "id", "amount", "b", "created_note", "tags", "doc"]


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with open_pool(db_url, max_size=2) as p:
        yield p


def keys(body: str) -> list[tuple[str, list[str]]]:
    """The body's members in order, each with its own members' names in order."""
    pairs: list[tuple[str, Any]] = json.loads(body, object_pairs_hook=list)
    return [(k, [name for name, _ in v] if isinstance(v, list) else []) for k, v in pairs]


@pytest.fixture
def widgets(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE widgets (zeta text, id integer PRIMARY KEY,"
                 " amount numeric(8,2), b boolean, created_note text, tags text[], doc jsonb)")
    conn.execute("SELECT webhooks.attach('widgets'::regclass, 'widgets', 'widget',"
                 " include_previous => true)")


def bodies(conn: psycopg.Connection) -> list[str]:
    return [b for (b,) in conn.execute("SELECT body FROM webhooks.events ORDER BY id")]


async def test_captured_rows_are_sent_in_table_order(pool: AsyncConnectionPool,
                                                     conn: psycopg.Connection,
                                                     widgets: None) -> None:
    subscribe(conn, events=["widget.create", "widget.update"], resource="widgets")
    conn.execute("INSERT INTO widgets VALUES ('z', 1, 42.00, true, 'n', '{a,b}',"
                 " '{\"y\": 1, \"x\": [1, 2]}')")
    conn.execute("UPDATE widgets SET amount = 43.10, zeta = 'zz' WHERE id = 1")
    await drain_outbox(Store(pool), 100)
    created, updated = bodies(conn)
    assert keys(created) == [
        ("event", ["id", "name", "resource", "resource_id", "user_id", "occurred_at"]),
        ("resource", COLUMNS)]
    assert keys(updated) == [
        ("event", ["id", "name", "resource", "resource_id", "user_id", "occurred_at",
                   "changed"]),
        ("resource", COLUMNS), ("previous", COLUMNS)]
    # Values are written as before: numbers as they are (42.00), jsonb as jsonb writes it.
    assert ('"resource": {"zeta": "z", "id": 1, "amount": 42.00, "b": true, '
            '"created_note": "n", "tags": ["a", "b"], "doc": {"x": [1, 2], "y": 1}}'
            in created)
    update = json.loads(updated)
    assert update["event"]["changed"] == ["zeta", "amount"]
    assert update["previous"]["zeta"] == "z" and update["resource"]["zeta"] == "zz"


async def test_an_oversized_row_is_flagged_in_order(pool: AsyncConnectionPool,
                                                    conn: psycopg.Connection,
                                                    widgets: None) -> None:
    subscribe(conn, events=["widget.update"], resource="widgets")
    conn.execute("INSERT INTO widgets (id, zeta) VALUES (1, 'a')")
    conn.execute("UPDATE widgets SET zeta = repeat('x', 2000) WHERE id = 1")
    await drain_outbox(Store(pool), 100, max_row_bytes=1000)
    (body,) = bodies(conn)
    # The new row is over the limit, the old one is not.
    assert [k for k, _ in keys(body)] == ["event", "resource_omitted", "previous"]
    assert json.loads(body)["resource_omitted"] == "too_large"


def test_backfilled_rows_are_sent_in_table_order(conn: psycopg.Connection,
                                                 widgets: None) -> None:
    conn.execute("INSERT INTO widgets VALUES ('z', 1, 1.50, false, 'n', '{}', 'null')")
    sid, _ = subscribe(conn, events=["widget.create"], resource="widgets")
    conn.execute("SELECT webhooks.start_backfill(%s)", (sid,))
    conn.execute("SELECT * FROM webhooks.backfill_step(10, 262144, 1000)")
    (body,) = bodies(conn)
    assert keys(body) == [
        ("event", ["id", "name", "resource", "resource_id", "user_id", "occurred_at"]),
        ("resource", COLUMNS)]
    assert json.loads(body)["event"]["name"] == "widget.snapshot"


def test_operational_events_show_the_subscription_in_api_order(
        conn: psycopg.Connection) -> None:
    subject, _ = subscribe(conn, events=["invoice.create"], owner="o")
    subscribe(conn, events=["webhook.failing"], resource="webhooks", owner="o")
    conn.execute("SELECT webhooks.lifecycle_event(s, 'webhook.failing')"
                 " FROM webhooks.subscriptions s WHERE id = %s", (subject,))
    (body,) = bodies(conn)
    (api,) = conn.execute("SELECT webhooks.subscription_json(s) FROM webhooks.subscriptions s"
                          " WHERE id = %s", (subject,)).fetchone()  # type: ignore[misc]
    assert keys(body)[1] == ("resource", [k for k, _ in json.loads(api,
                                                                  object_pairs_hook=list)])
