"""The capture triggers: what lands in webhooks.outbox for each kind of change."""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.support.subscriptions import subscribe_to


def outbox(conn: psycopg.Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM webhooks.outbox_changes ORDER BY outbox_id, n"
                           ).fetchall()


ALL_INVOICE_EVENTS = ["invoice.create", "invoice.update", "invoice.delete",
                      "payment.create", "payment.update", "payment.delete"]


@pytest.fixture
def subscribed(conn: psycopg.Connection) -> psycopg.Connection:
    subscribe_to(conn, "invoices", ALL_INVOICE_EVENTS)
    return conn


def test_insert_update_delete_are_captured(subscribed: psycopg.Connection) -> None:
    conn = subscribed
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('A-1', 'ann', 10)")
    conn.execute("UPDATE invoices SET amount = 12 WHERE number = 'A-1'")
    conn.execute("DELETE FROM invoices WHERE number = 'A-1'")
    rows = outbox(conn)
    assert [r["name"] for r in rows] == ["invoice.create", "invoice.update", "invoice.delete"]
    created, updated, deleted = rows
    assert created["resource"] == "invoices" and created["hook_resource"] == "invoices"
    assert created["resource_id"] == created["row_data"]["id"]
    assert created["parent_resource"] is None and created["parent_id"] is None
    assert created["row_data"]["customer"] == "ann"
    assert updated["row_data"]["amount"] == 12
    # A delete carries the row as it was.
    assert deleted["row_data"]["amount"] == 12
    assert created["tenant_scoped"] is True and created["tenant"] == "acme"
    assert created["occurred_at"] is not None


def test_nested_row_carries_its_parent(subscribed: psycopg.Connection) -> None:
    conn = subscribed
    conn.execute("INSERT INTO invoices (id, number, customer, amount) VALUES (7, 'A', 'b', 1)")
    conn.execute("INSERT INTO payments (invoice_id, amount, card_token) VALUES (7, 1, 'tok_1')")
    payment = outbox(conn)[-1]
    assert payment["name"] == "payment.create"
    assert payment["resource"] == "payments"
    assert payment["hook_resource"] == "invoices"
    assert payment["parent_resource"] == "invoices" and payment["parent_id"] == 7


def test_excluded_columns_never_leave_the_database(subscribed: psycopg.Connection) -> None:
    conn = subscribed
    conn.execute("INSERT INTO invoices (id, number, customer, amount) VALUES (1, 'A', 'b', 1)")
    conn.execute("INSERT INTO payments (invoice_id, amount, card_token) VALUES (1, 1, 'tok_1')")
    payment = outbox(conn)[-1]
    assert "card_token" not in payment["row_data"]
    assert "tok_1" not in str(payment)


def test_include_row_false_captures_no_row(subscribed: psycopg.Connection) -> None:
    conn = subscribed
    conn.execute("SELECT webhooks.attach('public.invoices', resource => 'invoices', "
                 "noun => 'invoice', include_row => false)")
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('A', 'b', 1)")
    row = outbox(conn)[-1]
    assert row["row_data"] is None
    assert row["resource_id"] is not None


def test_rolled_back_transaction_produces_nothing(subscribed: psycopg.Connection) -> None:
    conn = subscribed
    with pytest.raises(RuntimeError), conn.transaction():
        conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('A', 'b', 1)")
        raise RuntimeError("roll back")
    assert outbox(conn) == []


def test_update_that_changes_nothing_produces_nothing(subscribed: psycopg.Connection) -> None:
    conn = subscribed
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('A', 'b', 1)")
    conn.execute("UPDATE invoices SET amount = amount, customer = 'b'")
    assert [r["name"] for r in outbox(conn)] == ["invoice.create"]
    # In a multi-row update only the rows that changed produce events.
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('B', 'c', 2)")
    conn.execute("UPDATE invoices SET customer = 'c'")
    updates = [r for r in outbox(conn) if r["name"] == "invoice.update"]
    assert [u["row_data"]["number"] for u in updates] == ["A"]


def test_user_id_sources_in_order(subscribed: psycopg.Connection) -> None:
    conn = subscribed
    role = conn.execute("SELECT session_user").fetchone()[0]  # type: ignore[index]
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('1', 'c', 1)")
    conn.execute("INSERT INTO invoices (number, customer, amount, updated_by) "
                 "VALUES ('2', 'c', 1, 'col-user')")
    with conn.transaction():
        conn.execute("SET LOCAL webhooks.user_id = '42'")
        conn.execute("INSERT INTO invoices (number, customer, amount, updated_by) "
                     "VALUES ('3', 'c', 1, 'col-user')")
    with conn.transaction():
        conn.execute("SET LOCAL webhooks.user_id = ''")  # empty counts as unset
        conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('4', 'c', 1)")
    assert [r["user_id"] for r in outbox(conn)] == [role, "col-user", "42", role]


def test_bulk_statement_captures_every_row_in_order(subscribed: psycopg.Connection) -> None:
    conn = subscribed
    conn.execute("INSERT INTO invoices (number, customer, amount) "
                 "SELECT 'N' || i, 'c', i FROM generate_series(1, 100) i")
    rows = outbox(conn)
    assert [r["row_data"]["number"] for r in rows] == [f"N{i}" for i in range(1, 101)]


def test_nothing_is_written_when_nobody_subscribes(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('A', 'b', 1)")
    assert outbox(conn) == []
    subscribe_to(conn, "invoices", ["invoice.update"])  # subscribed, but not to create
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('B', 'b', 1)")
    subscribe_to(conn, "invoices", ["invoice.create"], active=False)  # inactive
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('C', 'b', 1)")
    assert outbox(conn) == []
    subscribe_to(conn, "invoices", ["invoice.create"])
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('D', 'b', 1)")
    assert [r["row_data"]["number"] for r in outbox(conn)] == ["D"]


def test_one_notification_per_transaction_without_row_data(db_url: str,
                                                           subscribed: psycopg.Connection
                                                           ) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN webhooks")
        arm(listener)
        with subscribed.transaction():
            for i in range(3):
                subscribed.execute("INSERT INTO invoices (number, customer, amount) "
                                   "VALUES (%s, 'secret-customer', 1)", (f"N{i}",))
            subscribed.execute("UPDATE invoices SET amount = 2")
        notes = list(listener.notifies(timeout=2.0))
    assert len(notes) == 1
    assert notes[0].channel == "webhooks" and notes[0].payload == ""


def arm(listener: psycopg.Connection) -> None:
    """Registers the connection as a waiting worker, as the worker does before it sleeps."""
    listener.execute("INSERT INTO webhooks.wakeups (pid) VALUES (pg_backend_pid())")


def notifications_before_marker(listener: psycopg.Connection, writer: psycopg.Connection
                                ) -> list[str]:
    """Channels notified before a marker the writer sends now (the listener hears it)."""
    writer.execute("NOTIFY webhooks_marker")
    seen = []
    for note in listener.notifies(timeout=5.0):
        seen.append(note.channel)
        if note.channel == "webhooks_marker":
            break
    return seen


def test_no_notification_while_no_worker_waits(db_url: str,
                                               subscribed: psycopg.Connection) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN webhooks")
        listener.execute("LISTEN webhooks_marker")
        subscribed.execute("INSERT INTO invoices (number, customer, amount) "
                           "VALUES ('busy', 'c', 1)")
        assert notifications_before_marker(listener, subscribed) == ["webhooks_marker"]
        arm(listener)
        subscribed.execute("INSERT INTO invoices (number, customer, amount) "
                           "VALUES ('idle', 'c', 1)")
        assert notifications_before_marker(listener, subscribed) == [
            "webhooks", "webhooks_marker"]
    # Captured either way: the notification only wakes.
    assert [r["row_data"]["number"] for r in outbox(subscribed)] == ["busy", "idle"]


def test_concurrent_writers_notify_one_at_a_time(db_url: str,
                                                 subscribed: psycopg.Connection) -> None:
    # A writer notifies only while it holds the wakeup's token (webhooks.notify_lock_class):
    # commits that NOTIFY serialise on a database-wide lock, through their WAL flush.
    with psycopg.connect(db_url, autocommit=True) as listener, \
            psycopg.connect(db_url) as holder:
        listener.execute("LISTEN webhooks")
        listener.execute("LISTEN webhooks_marker")
        arm(listener)
        holder.execute("INSERT INTO invoices (number, customer, amount) VALUES ('a', 'c', 1)")
        # Committed while the holder's transaction has the token: no NOTIFY of its own.
        subscribed.execute("INSERT INTO invoices (number, customer, amount) "
                           "VALUES ('b', 'c', 1)")
        assert notifications_before_marker(listener, subscribed) == ["webhooks_marker"]
        holder.commit()
        assert notifications_before_marker(listener, subscribed) == [
            "webhooks", "webhooks_marker"]
        # The token is free again.
        subscribed.execute("INSERT INTO invoices (number, customer, amount) "
                           "VALUES ('c', 'c', 1)")
        assert notifications_before_marker(listener, subscribed) == [
            "webhooks", "webhooks_marker"]
    assert sorted(r["row_data"]["number"] for r in outbox(subscribed)) == ["a", "b", "c"]


def test_no_notification_for_a_rolled_back_transaction(db_url: str,
                                                       subscribed: psycopg.Connection) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN webhooks")
        listener.execute("LISTEN webhooks_marker")
        arm(listener)
        with pytest.raises(RuntimeError), subscribed.transaction():
            subscribed.execute("INSERT INTO invoices (number, customer, amount) "
                               "VALUES ('x', 'y', 1)")
            raise RuntimeError("roll back")
        # A marker sent after the rollback: whatever the rollback sent would arrive before it.
        seen = notifications_before_marker(listener, subscribed)
    assert seen == ["webhooks_marker"]


def test_no_notification_for_a_statement_that_queued_nothing(
        db_url: str, subscribed: psycopg.Connection) -> None:
    # The probe finds the event wanted and a worker waiting, but an UPDATE whose rows keep
    # their captured form queues no change: nothing to wake a worker for.
    subscribed.execute("INSERT INTO invoices (number, customer, amount) VALUES ('A', 'b', 1)")
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN webhooks")
        listener.execute("LISTEN webhooks_marker")
        arm(listener)
        subscribed.execute("UPDATE invoices SET amount = amount")
        subscribed.execute("UPDATE invoices SET amount = 5 WHERE false")
        assert notifications_before_marker(listener, subscribed) == ["webhooks_marker"]
        subscribed.execute("UPDATE invoices SET amount = 5")
        assert notifications_before_marker(listener, subscribed) == [
            "webhooks", "webhooks_marker"]
    assert [r["name"] for r in outbox(subscribed)] == ["invoice.create", "invoice.update"]


def test_changes_from_psql_are_captured(db_url: str, subscribed: psycopg.Connection) -> None:
    subprocess.run(["psql", db_url, "-v", "ON_ERROR_STOP=1", "-q", "-c",
                    "INSERT INTO invoices (number, customer, amount) VALUES ('P', 'psql', 3)"],
                   check=True)
    assert [r["row_data"]["customer"] for r in outbox(subscribed)] == ["psql"]


def test_application_role_needs_no_rights_on_the_webhooks_schema(
        db_url: str, subscribed: psycopg.Connection) -> None:
    conn = subscribed
    conn.execute("DROP ROLE IF EXISTS webhooks_test_app")
    conn.execute("CREATE ROLE webhooks_test_app")
    try:
        conn.execute("GRANT ALL ON invoices TO webhooks_test_app")
        with conn.transaction():
            conn.execute("SET LOCAL ROLE webhooks_test_app")
            conn.execute("INSERT INTO invoices (id, number, customer, amount) "
                         "VALUES (99, 'R', 'role', 1)")
        assert outbox(conn)[-1]["resource_id"] == 99
    finally:
        conn.execute("REVOKE ALL ON invoices FROM webhooks_test_app")
        conn.execute("DROP ROLE webhooks_test_app")


def test_a_callers_search_path_cannot_hijack_the_definer_function(
        subscribed: psycopg.Connection) -> None:
    conn = subscribed
    conn.execute("CREATE SCHEMA hijack")
    conn.execute("CREATE FUNCTION hijack.to_jsonb(anyelement) RETURNS jsonb "
                 "LANGUAGE sql AS $$ SELECT '{\"hijacked\": true}'::jsonb $$")
    conn.execute("CREATE FUNCTION hijack.statement_timestamp() RETURNS timestamptz "
                 "LANGUAGE sql AS $$ SELECT 'epoch'::timestamptz $$")
    with conn.transaction():
        conn.execute("SET LOCAL search_path = hijack, public, pg_catalog")
        conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('H', 'c', 1)")
    row = outbox(conn)[-1]
    assert row["row_data"]["number"] == "H"
    assert row["occurred_at"].year > 2000
