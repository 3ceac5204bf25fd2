"""The SQL functions under redelivery and recovery (webhooks.redeliver, webhooks.recover):
what they requeue, their errors and their rights (an outage and its recovery through the
API and a worker: tests/e2e/test_recovery.py)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.support.subscriptions import subscribe


def seed(conn: psycopg.Connection, sid: int, status: str, created: str) -> int:
    # The partitions of a day in the past, which the service itself never writes to.
    conn.execute("SELECT webhooks.ensure_partitions(%s::timestamptz, %s::timestamptz)",
                 (created, created))
    row = conn.execute(
        "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
        " VALUES (nextval('webhooks.event_ids'), 'invoices', 'invoice.create', now(), '{}')"
        " RETURNING id)"
        " INSERT INTO webhooks.deliveries (event_id, subscription_id, status, attempts,"
        " created_at, next_attempt_at, lease_expires_at, finished_at)"
        " SELECT e.id, %s, %s, 3, %s::timestamptz, now() + interval '1 hour',"
        " CASE WHEN %s = 'pending' THEN now() + interval '1 hour' END,"
        " CASE WHEN %s <> 'pending' THEN now() END FROM e RETURNING id",
        (sid, status, created, status, status)).fetchone()
    assert row is not None
    return int(row[0])


def test_sql_recover_takes_the_failed_ones_of_the_window(conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn)
    other, _ = subscribe(conn)
    before = seed(conn, sid, "failed", "2026-01-01T00:00:00Z")
    first = seed(conn, sid, "failed", "2026-01-02T00:00:00Z")
    done = seed(conn, sid, "succeeded", "2026-01-02T01:00:00Z")
    second = seed(conn, sid, "failed", "2026-01-02T02:00:00Z")
    at_until = seed(conn, sid, "failed", "2026-01-03T00:00:00Z")
    elsewhere = seed(conn, other, "failed", "2026-01-02T00:00:00Z")
    [(count,)] = conn.execute(
        "SELECT webhooks.recover(%s, '2026-01-02T00:00:00Z', '2026-01-03T00:00:00Z')",
        (sid,)).fetchall()
    assert count == 2
    rows = conn.execute(
        "SELECT id, status, attempts, next_attempt_at <= now(), lease_expires_at, finished_at"
        " FROM webhooks.deliveries WHERE status = 'pending' ORDER BY next_attempt_at, id"
    ).fetchall()
    assert rows == [(first, "pending", 0, True, None, None),
                    (second, "pending", 0, True, None, None)]
    assert {r[0]: r[1] for r in conn.execute(
        "SELECT id, status FROM webhooks.deliveries").fetchall()} == {
        before: "failed", first: "pending", done: "succeeded", second: "pending",
        at_until: "failed", elsewhere: "failed"}
    # Without until: everything failed since.
    [(count,)] = conn.execute("SELECT webhooks.recover(%s, '2025-01-01T00:00:00Z', NULL)",
                              (sid,)).fetchall()
    assert count == 2


def test_sql_redeliver_whatever_the_status(conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn)
    for status in ("succeeded", "failed", "pending"):
        did = seed(conn, sid, status, "2026-01-01T00:00:00Z")
        assert conn.execute("SELECT webhooks.redeliver(%s)", (did,)).fetchall() == [(did,)]
        row = conn.execute(
            "SELECT status, attempts, next_attempt_at <= now(), lease_expires_at, finished_at"
            " FROM webhooks.deliveries WHERE id = %s", (did,)).fetchone()
        assert row == ("pending", 0, True, None, None), status


def test_sql_errors_name_the_problem(conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn)
    did = seed(conn, sid, "failed", "2026-01-01T00:00:00Z")
    with pytest.raises(psycopg.errors.NoDataFound, match="no delivery with id 987654"):
        conn.execute("SELECT webhooks.redeliver(987654)")
    with pytest.raises(psycopg.errors.NoDataFound, match="no subscription with id 987654"):
        conn.execute("SELECT webhooks.recover(987654, now() - interval '1 day', NULL)")
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="since"):
        conn.execute("SELECT webhooks.recover(%s, NULL, NULL)", (sid,))
    conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s", (sid,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="inactive"):
        conn.execute("SELECT webhooks.redeliver(%s)", (did,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="inactive"):
        conn.execute("SELECT webhooks.recover(%s, '2020-01-01Z', NULL)", (sid,))
    assert conn.execute("SELECT status FROM webhooks.deliveries WHERE id = %s",
                        (did,)).fetchone() == ("failed",)


def test_functions_are_not_public(conn: psycopg.Connection) -> None:
    rows = conn.execute(
        "SELECT p.proname, p.proacl::text[], p.proconfig FROM pg_proc p"
        " WHERE p.pronamespace = 'webhooks'::regnamespace"
        " AND p.proname IN ('redeliver', 'recover') ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == ["recover", "redeliver"]
    for name, acl, config in rows:
        assert acl is not None and not any(a.startswith("=") for a in acl), (name, acl)
        assert config == ["search_path=pg_catalog, pg_temp"], (name, config)
    role = f"webhooks_probe_{uuid.uuid4().hex[:10]}"
    conn.execute(f"CREATE ROLE {role}".encode())
    try:
        for signature in ("redeliver(bigint)", "recover(bigint, timestamptz, timestamptz)"):
            [(allowed,)] = conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')",
                                        (role, f"webhooks.{signature}")).fetchall()
            assert allowed is False, signature
    finally:
        conn.execute(f"DROP ROLE {role}".encode())
