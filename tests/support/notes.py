"""A table of the application's, `notes`, attached as the DBA would with webhooks.attach
and its settings, and the bodies of the events made (tests/db/test_attach.py,
tests/db/test_backfill_sql.py, tests/e2e/test_guest_dba.py)."""

from __future__ import annotations

import json
from typing import Any

import psycopg


def make_notes(conn: psycopg.Connection, **settings: Any) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS notes (id bigint PRIMARY KEY, body text, "
                 "secret text)")
    attach(conn, **settings)


def attach(conn: psycopg.Connection, **settings: Any) -> None:
    args = "".join(f", {name} => %({name})s" for name in settings)
    conn.execute("SELECT webhooks.attach('notes', resource => 'notes', noun => 'note'"
                 + args + ")", settings)


def bodies(conn: psycopg.Connection, name: str) -> list[dict[str, Any]]:
    return [json.loads(r[0]) for r in conn.execute(
        "SELECT body FROM webhooks.events WHERE name = %s ORDER BY id", (name,)).fetchall()]
