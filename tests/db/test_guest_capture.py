"""The capture in a guest's database: whatever the writer's session says about date
styles, time zones, interval styles, float digits or bytea output, one change makes the
same event, and each capture function pins only the settings its columns' text forms
depend on (tests/support/hostile.py; tests/e2e/test_guest_settings.py delivers under the
same defaults)."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.support.hostile import writer
from tests.support.subscriptions import subscribe_to

GADGETS = """
CREATE TABLE public.gadgets (
    id     bigint PRIMARY KEY,
    at     timestamptz,
    stamps timestamptz[],
    day    date,
    span   interval,
    ratio  float8,
    small  float4,
    blob   bytea,
    price  numeric,
    period tstzrange
);
SELECT webhooks.attach('public.gadgets', resource => 'gadgets', noun => 'gadget');
"""

GADGET = ("INSERT INTO gadgets VALUES (1, '2026-01-02 03:04:05.123456+00',"
          " ARRAY['2026-01-02 03:04:05+00'::timestamptz], '2026-01-02',"
          " '1 day 02:03:04.5', 0.1, 1.1, decode('00ff', 'hex'), 12.50,"
          " tstzrange('2026-01-02 00:00+00', '2026-01-03 00:00+00'))")


def test_capture_makes_the_same_event_whatever_the_writers_settings(
        db_url: str, conn: psycopg.Connection) -> None:
    conn.execute(GADGETS)
    subscribe_to(conn, "gadgets", ["gadget.create"])
    conn.execute(GADGET)
    conn.execute("DELETE FROM gadgets")
    with writer(db_url) as app:
        app.execute(GADGET)
        # Inside the application's own transaction, its settings are still its own.
        app.execute("BEGIN")
        app.execute("INSERT INTO gadgets (id) VALUES (2)")
        assert app.execute("SHOW TimeZone").fetchone() == ("Asia/Kolkata",)
        assert app.execute("SHOW extra_float_digits").fetchone() == ("-15",)
        app.execute("ROLLBACK")
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute("SELECT rows::text AS rows FROM webhooks.outbox"
                           " WHERE name = 'gadget.create' ORDER BY id").fetchall()
    assert len(rows) == 2
    assert rows[0]["rows"] == rows[1]["rows"]
    [[_, _, _, _, row]] = json.loads(rows[0]["rows"])
    assert row == {
        "id": 1, "at": "2026-01-02T03:04:05.123456+00:00",
        "stamps": ["2026-01-02T03:04:05+00:00"], "day": "2026-01-02",
        "span": "1 day 02:03:04.5", "ratio": 0.1, "small": 1.1, "blob": "\\x00ff",
        "price": 12.50, "period": '["2026-01-02 00:00:00+00","2026-01-03 00:00:00+00")'}


# Each column type, where it goes (the row's JSON, or the text of a tenant or pairing key),
# a value, and the settings the capture function must pin for it: the others are left to
# the writer's session (each pinned setting costs every captured statement).
TYPED_COLUMNS = [
    ("integer", "row", "7", set()),
    ("text[]", "row", "ARRAY['a', NULL]", set()),
    ("jsonb", "row", "'{\"n\": 1.50}'", set()),
    ("numeric(6, 2)", "tenant", "12.5", set()),
    ("float8", "row", "1.23456789", {"extra_float_digits"}),
    ("real[]", "row", "ARRAY[1.1]", {"extra_float_digits"}),
    ("bytea", "row", "decode('00ff', 'hex')", {"bytea_output"}),
    ("interval", "row", "'1 day 02:03:04.5'", {"IntervalStyle"}),
    ("date", "row", "'2026-01-02'", set()),
    ("date", "tenant", "'2026-01-02'", {"DateStyle"}),
    ("timestamp", "row", "'2026-01-02 03:04:05.5'", set()),
    ("timestamptz", "row", "'2026-01-02 03:04:05.5+00'", {"TimeZone"}),
    ("timestamptz", "key", "'2026-01-02 03:04:05.5+00'", {"TimeZone", "DateStyle"}),
    ("time", "row", "'03:04:05'", {"DateStyle"}),
    ("tstzrange", "row", "tstzrange('2026-01-02 00:00+00', '2026-01-03 00:00+00')",
     {"TimeZone", "DateStyle", "IntervalStyle", "extra_float_digits", "bytea_output"}),
    ("money", "row", "12.5",
     {"TimeZone", "DateStyle", "IntervalStyle", "extra_float_digits", "bytea_output"}),
]


@pytest.mark.parametrize(("kind", "role", "value", "pinned"), TYPED_COLUMNS,
                         ids=[f"{k}-{r}" for k, r, _, _ in TYPED_COLUMNS])
def test_capture_pins_the_settings_its_columns_depend_on(
        db_url: str, conn: psycopg.Connection, kind: str, role: str, value: str,
        pinned: set[str]) -> None:
    # `key`: the column is the table's id, so its text form pairs an UPDATE's rows.
    id_type, row_id = (kind, value) if role == "key" else ("integer", "1")
    conn.execute(f"CREATE TABLE public.typed (id {id_type} PRIMARY KEY, v {kind},"
                 " n integer DEFAULT 0)")
    conn.execute("SELECT webhooks.attach('public.typed', resource => 'typed', noun => 'typed',"
                 " tenant_column => %s)", ("v" if role == "tenant" else None,))
    subscribe_to(conn, "typed", ["typed.create", "typed.update"])
    config = conn.execute(
        "SELECT coalesce(p.proconfig, '{}') FROM pg_proc p"
        " JOIN webhooks.attachments a ON p.proname = 'capture_' || a.id"
        " WHERE a.table_oid = 'public.typed'::regclass").fetchone()
    assert config is not None
    assert {c.split("=", 1)[0] for c in config[0]} == pinned
    insert = f"INSERT INTO typed (id, v) VALUES ({row_id}, {value})"
    update = "UPDATE typed SET n = n + 1"
    conn.execute(insert)
    conn.execute(update)
    conn.execute("DELETE FROM typed")
    with writer(db_url) as app:
        app.execute(insert)
        app.execute(update)
    rows = [r[0] for r in conn.execute(
        "SELECT rows::text FROM webhooks.outbox WHERE resource = 'typed'"
        " ORDER BY name, id").fetchall()]
    # The server's defaults and the writer's hostile formats made the same events.
    assert len(rows) == 4, rows
    assert rows[0] == rows[1] and rows[2] == rows[3]


def test_a_retyped_or_added_column_brings_its_settings(conn: psycopg.Connection) -> None:
    def pinned() -> set[str]:
        row = conn.execute(
            "SELECT coalesce(p.proconfig, '{}') FROM pg_proc p"
            " JOIN webhooks.attachments a ON p.proname = 'capture_' || a.id"
            " WHERE a.table_oid = 'public.retyped'::regclass").fetchone()
        assert row is not None
        return {c.split("=", 1)[0] for c in row[0]}

    conn.execute("CREATE TABLE public.retyped (id integer PRIMARY KEY, v integer)")
    conn.execute("SELECT webhooks.attach('public.retyped', resource => 'retyped',"
                 " noun => 'retyped')")
    assert pinned() == set()
    conn.execute("ALTER TABLE retyped ALTER COLUMN v TYPE timestamptz USING NULL")
    assert pinned() == {"TimeZone"}
    conn.execute("ALTER TABLE retyped ADD COLUMN blob bytea")
    assert pinned() == {"TimeZone", "bytea_output"}
    conn.execute("ALTER TABLE retyped DROP COLUMN v")
    assert pinned() == {"bytea_output"}
