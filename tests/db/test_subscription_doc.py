"""Each subscription's stored document (webhooks.subscriptions.doc, which the API's reads
return): written by the table's trigger on every kind of write, and written again by
`migrate` where it no longer matches what webhooks.subscription_json makes."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from service import db
from tests.support.subscriptions import subscribe_to


def docs(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """(id, stored doc, the doc built now) of every subscription."""
    return [tuple(r) for r in conn.execute(
        "SELECT s.id, s.doc, webhooks.subscription_json(s) FROM webhooks.subscriptions s"
        " ORDER BY s.id").fetchall()]


def assert_current(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Every stored doc is the one built now; returns the first, parsed."""
    rows = docs(conn)
    assert rows
    for sid, stored, built in rows:
        assert stored == built, f"subscription {sid}: stored {stored!r}, built {built!r}"
    parsed: dict[str, Any] = json.loads(rows[0][1])
    return parsed


def test_the_doc_follows_every_write(conn: psycopg.Connection[Any]) -> None:
    sid = subscribe_to(conn, "invoices", ["invoice.create"])
    other = subscribe_to(conn, "invoices", ["invoice.update"], active=False)
    assert assert_current(conn)["events"] == "invoice.create"

    # As the worker records attempts: status, times, and a hostile failure text.
    conn.execute(
        "UPDATE webhooks.subscriptions SET last_status = 500,"
        " last_failure_at = '2026-01-02 03:04:05.000006+00',"
        " last_failure_content = %s WHERE id = %s",
        ('quote " backslash \\ newline \n tab \t é', sid))
    doc = assert_current(conn)
    assert doc["last_status"] == 500
    assert doc["last_failure_at"] == "2026-01-02T03:04:05.000006Z"
    assert doc["last_failure_content"] == 'quote " backslash \\ newline \n tab \t é'

    # As the API and the lifecycle change it, and as a DBA would in plain SQL.
    conn.execute("UPDATE webhooks.subscriptions SET active = false,"
                 " inactive_reason = 'disabled' WHERE id = %s", (sid,))
    assert assert_current(conn)["inactive_reason"] == "disabled"
    conn.execute("UPDATE webhooks.subscriptions SET active = true WHERE id = %s", (sid,))
    doc = assert_current(conn)
    assert doc["active"] is True and doc["inactive_reason"] is None  # the reactivation trigger's
    conn.execute("UPDATE webhooks.subscriptions SET target = 'http://127.0.0.1:9/other',"
                 " events = '{invoice.create,invoice.delete}', ordering = 'strict',"
                 " filter = '{\"amount\": {\"gt\": 1}}' WHERE id = %s", (sid,))
    doc = assert_current(conn)
    assert doc["target"] == "http://127.0.0.1:9/other"
    assert doc["events"] == "invoice.create,invoice.delete"
    assert doc["ordering"] == "strict" and doc["filter"] == {"amount": {"gt": 1}}
    # Nobody can store a doc of their own: the trigger writes it.
    conn.execute("UPDATE webhooks.subscriptions SET doc = '{}' WHERE id = %s", (other,))
    assert_current(conn)


def test_migrate_rewrites_stale_docs_and_leaves_current_ones(
        db_url: str, conn: psycopg.Connection[Any]) -> None:
    stale = subscribe_to(conn, "invoices", ["invoice.create"])
    current = subscribe_to(conn, "invoices", ["invoice.update"])
    # A doc from before the column existed (NULL), or made by an earlier
    # webhooks.subscription_json: written past the trigger.
    conn.execute("ALTER TABLE webhooks.subscriptions DISABLE TRIGGER subscriptions_9_doc")
    conn.execute("UPDATE webhooks.subscriptions SET doc = NULL WHERE id = %s", (stale,))
    conn.execute("ALTER TABLE webhooks.subscriptions ENABLE TRIGGER subscriptions_9_doc")
    (before,) = conn.execute("SELECT xmin::text FROM webhooks.subscriptions WHERE id = %s",
                             (current,)).fetchone() or (None,)

    db.migrate(db_url)

    assert_current(conn)
    (after,) = conn.execute("SELECT xmin::text FROM webhooks.subscriptions WHERE id = %s",
                            (current,)).fetchone() or (None,)
    assert after == before, "a current doc was written again"
