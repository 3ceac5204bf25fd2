"""A backfill's status read directly in the database, for tests that start backfills with
webhooks.start_backfill and wait for them (tests/db/test_backfill_sql.py,
tests/e2e/test_backfill.py)."""

from __future__ import annotations

import psycopg


def backfill_status(conn: psycopg.Connection, bid: int) -> str:
    row = conn.execute("SELECT status FROM webhooks.backfills WHERE id = %s", (bid,)).fetchone()
    assert row is not None
    return str(row[0])
