"""Subscriptions made directly in the database, as the API would after its handshake: for
tests, chaos and bench, which need many, or ones the API would refuse (loopback targets,
chosen secrets)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from service.api.handshake import new_secret

INVOICE_EVENTS = ["invoice.create", "invoice.update", "invoice.delete",
                  "payment.create", "payment.update", "payment.delete"]
# A target nothing answers on: for tests of capture and fan-out, where nothing is sent.
NOWHERE = "http://127.0.0.1:9/"


def subscribe(conn: psycopg.Connection[Any], target: str = NOWHERE, *,
              events: Sequence[str] | None = None, resource: str = "invoices",
              tenant: str | None = None, active: bool = True, owner: str = "tests",
              secret: str | None = None) -> tuple[int, str]:
    """Inserts one subscription (default: to every invoice event, with a fresh secret);
    returns (id, secret)."""
    secret = new_secret() if secret is None else secret
    row = conn.execute(
        "INSERT INTO webhooks.subscriptions (owner, tenant, resource, events, target, secret,"
        " active) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (owner, tenant, resource, list(events or INVOICE_EVENTS), target, secret, active),
    ).fetchone()
    assert row is not None
    return row[0], secret


def subscribe_to(conn: psycopg.Connection[Any], resource: str, events: Sequence[str], *,
                 active: bool = True, tenant: str | None = None) -> int:
    """The id of a new subscription to `events` of `resource` that points nowhere."""
    return subscribe(conn, events=events, resource=resource, tenant=tenant, active=active,
                     owner="tester")[0]


def subscribe_many(conn: psycopg.Connection[Any], count: int, *, resource: str,
                   events: Sequence[str], owners: int | None = None, owner: str = "o",
                   tenant: str = "t", target: str = NOWHERE, secret: str = "s") -> None:
    """Inserts `count` subscriptions in one statement, tenants `tenant1`...; one owner, or
    `owners` of them (`owner0`...) taking turns."""
    conn.execute(
        "INSERT INTO webhooks.subscriptions (owner, tenant, resource, events, target, secret)"
        " SELECT CASE WHEN %(owners)s::int IS NULL THEN %(owner)s"
        " ELSE %(owner)s || (i %% %(owners)s::int) END,"
        " %(tenant)s || i, %(resource)s, %(events)s, %(target)s, %(secret)s"
        " FROM generate_series(1, %(count)s) AS i",
        {"owners": owners, "owner": owner, "tenant": tenant, "resource": resource,
         "events": list(events), "target": target, "secret": secret, "count": count})


def subscription(conn: psycopg.Connection[Any], sid: int) -> dict[str, Any]:
    """The subscription row as a dict."""
    cur = conn.cursor(row_factory=dict_row)
    row = cur.execute("SELECT * FROM webhooks.subscriptions WHERE id = %s", (sid,)).fetchone()
    assert row is not None
    return row
