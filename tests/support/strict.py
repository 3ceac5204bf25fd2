"""Strict ordering's queue, for the tests of its parking in the database alone
(tests/db/test_strict_parking.py) and with a worker delivering it
(tests/e2e/test_strict_parking.py): a strict subscription, invoices inserted in one
statement, and the subscription's pending deliveries as the claim sees them."""

from __future__ import annotations

import psycopg

from tests.support.subscriptions import subscribe


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
