"""A row that changes its tenant column has left one tenant and arrived at another: the old
tenant's subscriptions get `<noun>.delete` with the row as it was, the new tenant's
`<noun>.create` with the row as it is, and no event shows one tenant the other's values.
Subscriptions without a tenant see every tenant's rows and get the one `.update`."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe

EVENTS = ["order.create", "order.update", "order.delete"]


def setup(conn: psycopg.Connection, include_previous: bool = True) -> dict[str | None, int]:
    """public.orders attached with a tenant column, and a subscription of tenant A, one of
    tenant B and one without a tenant, each to every event; their ids by tenant."""
    conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, tenant text, note text)")
    conn.execute("SELECT webhooks.attach('public.orders', 'orders', 'order', "
                 "tenant_column => 'tenant', include_previous => %s)", (include_previous,))
    return {tenant: subscribe(conn, resource="orders", events=EVENTS, tenant=tenant)[0]
            for tenant in ("A", "B", None)}


def received(conn: psycopg.Connection) -> dict[int, list[dict[str, Any]]]:
    """The bodies queued for each subscription, in order."""
    got: dict[int, list[dict[str, Any]]] = {}
    for sid, body in conn.execute(
            "SELECT d.subscription_id, e.body FROM webhooks.deliveries d"
            " JOIN webhooks.events e ON e.id = d.event_id ORDER BY d.id").fetchall():
        got.setdefault(sid, []).append(json.loads(body))
    return got


async def test_a_row_moved_to_another_tenant_is_a_delete_and_a_create(
        conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    subs = setup(conn)
    conn.execute("INSERT INTO public.orders VALUES (43, 'A', 'tenant A private note'),"
                 " (44, 'A', 'stays')")
    await drain_outbox(Store(pool), 100)
    conn.execute("DELETE FROM webhooks.deliveries")
    conn.execute("UPDATE public.orders SET tenant = 'B', note = 'moved' WHERE id = 43")
    conn.execute("UPDATE public.orders SET note = note || '!'")
    await drain_outbox(Store(pool), 100)
    got = received(conn)
    old_tenant, new_tenant, everyone = got[subs["A"]], got[subs["B"]], got[subs[None]]
    # Tenant A: the row left, as it was; then the update of the row that stayed.
    assert [b["event"]["name"] for b in old_tenant] == ["order.delete", "order.update"]
    assert old_tenant[0]["resource"] == {"id": 43, "tenant": "A",
                                         "note": "tenant A private note"}
    assert old_tenant[0]["event"]["resource_id"] == 43
    assert "previous" not in old_tenant[0] and "changed" not in old_tenant[0]["event"]
    assert old_tenant[1]["resource"]["id"] == 44
    # Tenant B: the row arrived, as it is, and nothing of tenant A.
    assert [b["event"]["name"] for b in new_tenant] == ["order.create", "order.update"]
    assert new_tenant[0]["resource"] == {"id": 43, "tenant": "B", "note": "moved"}
    assert "previous" not in new_tenant[0] and "changed" not in new_tenant[0]["event"]
    assert new_tenant[1]["previous"] == {"id": 43, "tenant": "B", "note": "moved"}
    assert "private" not in json.dumps(new_tenant)
    # Without a tenant: one update per change, the move with the row as it was.
    assert [b["event"]["name"] for b in everyone] == ["order.update"] * 3
    assert everyone[0]["previous"]["note"] == "tenant A private note"
    assert everyone[0]["event"]["changed"] == ["tenant", "note"]
    # The events of each tenant are its own (the API scopes the delivery log by them).
    assert conn.execute("SELECT e.tenant FROM webhooks.deliveries d JOIN webhooks.events e"
                        " ON e.id = d.event_id WHERE d.subscription_id = %s ORDER BY d.id",
                        (subs["A"],)).fetchall() == [("A",), ("A",)]


async def test_a_move_is_captured_when_only_create_and_delete_are_wanted(
        conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, tenant text, note text)")
    conn.execute("SELECT webhooks.attach('public.orders', 'orders', 'order', "
                 "tenant_column => 'tenant', include_previous => true)")
    old, _ = subscribe(conn, resource="orders", events=["order.delete"], tenant="A")
    new, _ = subscribe(conn, resource="orders", events=["order.create"], tenant="B")
    conn.execute("INSERT INTO public.orders VALUES (1, 'A', 'x')")
    conn.execute("UPDATE public.orders SET tenant = 'B'")
    await drain_outbox(Store(pool), 100)
    got = received(conn)
    assert [b["event"]["name"] for b in got[old]] == ["order.delete"]
    assert [b["event"]["name"] for b in got[new]] == ["order.create"]


async def test_a_move_to_or_from_no_tenant_leaves_and_arrives_too(
        conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    subs = setup(conn, include_previous=False)
    conn.execute("INSERT INTO public.orders VALUES (1, 'A', 'a note'), (2, NULL, 'nobody')")
    await drain_outbox(Store(pool), 100)
    conn.execute("DELETE FROM webhooks.deliveries")
    conn.execute("UPDATE public.orders SET tenant = CASE id WHEN 1 THEN NULL ELSE 'B' END")
    await drain_outbox(Store(pool), 100)
    got = received(conn)
    assert [(b["event"]["name"], b["resource"]) for b in got[subs["A"]]] == [
        ("order.delete", {"id": 1, "tenant": "A", "note": "a note"})]
    assert [(b["event"]["name"], b["resource"]) for b in got[subs["B"]]] == [
        ("order.create", {"id": 2, "tenant": "B", "note": "nobody"})]
    assert [b["event"]["name"] for b in got[subs[None]]] == ["order.update"] * 2
