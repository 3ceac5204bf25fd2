"""The service as a guest in someone else's database: whatever `ALTER DATABASE ... SET`
(or `ALTER ROLE`) and the application's sessions say about date styles, time zones,
timeouts, isolation or encodings, the service's connections set their own and the
capture turns one change into the same event (service/db.py SESSION_SETTINGS)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from service import db, tokens
from service.config import Settings
from service.store import Store
from service.worker import pruning
from service.worker.pruning import prune
from tests.support.api import serving
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe, subscribe_to
from tests.support.worker import open_pool, payloads, poll, running_worker

# What a database's owner may have set for everyone: each breaks something the service
# did with the server's defaults. (yoyo keeps its tables in schema webhooks whatever
# search_path says: tests/db/test_migrate_guest.py.)
HOSTILE = {
    "DateStyle": "SQL, DMY",
    "TimeZone": "Asia/Kolkata",
    "IntervalStyle": "sql_standard",
    "extra_float_digits": "-15",
    "bytea_output": "escape",
    "client_encoding": "LATIN1",
    "standard_conforming_strings": "off",
    "array_nulls": "off",
    "xmloption": "document",
    "search_path": "evil, public",
    "default_transaction_read_only": "on",
    "default_transaction_isolation": "serializable",
    "statement_timeout": "50ms",
    "lock_timeout": "1ms",
    "idle_in_transaction_session_timeout": "100ms",
}

# What an application's (or a DBA's psql) session may say for itself: the formats only,
# so that it can still write.
WRITER = ("-c DateStyle=SQL,DMY -c TimeZone=Asia/Kolkata -c IntervalStyle=sql_standard"
          " -c extra_float_digits=-15 -c bytea_output=escape"
          " -c standard_conforming_strings=off")

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def make_hostile(conn: psycopg.Connection, url: str, scope: str = "database") -> str:
    """Sets HOSTILE as the defaults of the database at `url`, or of the service's role in
    it (`scope` "role"), for new sessions only (`conn`, already open, keeps the server's
    defaults); returns `url`."""
    name = urlsplit(url).path.lstrip("/")
    target = ("ALTER DATABASE {}" if scope == "database"
              else "ALTER ROLE CURRENT_USER IN DATABASE {}")
    for setting, value in HOSTILE.items():
        # A list is set as identifiers: a literal would name one schema "evil, public".
        conn.execute(psycopg.sql.SQL(target + " SET {} = {}").format(
            psycopg.sql.Identifier(name), psycopg.sql.Identifier(setting),
            psycopg.sql.SQL(", ").join(map(psycopg.sql.Identifier, value.split(", ")))
            if setting == "search_path" else psycopg.sql.Literal(value)))
    return url


@pytest.fixture(params=["database", "role"])
def hostile(request: pytest.FixtureRequest, db_url: str, conn: psycopg.Connection) -> str:
    """The test's database (migrated, with the invoices example) with HOSTILE defaults,
    set for the database or for the service's role in it."""
    return make_hostile(conn, db_url, request.param)


def writer(url: str) -> psycopg.Connection:
    """An application's session: its own formats, but one that may write."""
    return psycopg.connect(url, autocommit=True, client_encoding="UTF8", options=(
        WRITER + " -c default_transaction_read_only=off -c statement_timeout=0"
        " -c lock_timeout=0 -c search_path=public"))


@asynccontextmanager
async def api_on(url: str, conn: psycopg.Connection) -> AsyncIterator[httpx.AsyncClient]:
    """The API serving `url`, with a client holding a token for alice (made on `conn`)."""
    token = tokens.create(conn, "alice")[1]
    settings = Settings(database_url=url, allow_private_targets=True, verify_timeout=2.0)
    async with serving(settings) as base, httpx.AsyncClient(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}) as http:
        yield http


async def test_the_api_and_the_worker_deliver_under_hostile_defaults(
        hostile: str, conn: psycopg.Connection) -> None:
    async with Receiver() as receiver, api_on(hostile, conn) as http:
        response = await http.post("/api/v1/webhooks/", json={
            "resource": "invoices", "events": "invoice.create", "target": receiver.url})
        assert response.status_code == 201, response.text
        sid = response.json()["id"]
        response = await http.get("/api/v1/webhooks/")
        assert response.status_code == 200, response.text
        assert [s["id"] for s in response.json()] == [sid]

        async with running_worker(hostile):
            with writer(hostile) as app:
                app.execute("INSERT INTO invoices (number, customer, amount)"
                            " VALUES ('G-1', 'Zoë ✓', 12.5)")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
            await poll(lambda: conn.execute("SELECT status FROM webhooks.deliveries"
                                            ).fetchall() == [("succeeded",)],
                       what="the delivery recorded")

        [payload] = payloads(receiver.deliveries())
        assert payload["resource"]["number"] == "G-1"
        assert payload["resource"]["customer"] == "Zoë ✓"
        assert payload["resource"]["amount"] == 12.5
        # The row's timestamp in UTC, whatever the writer's or the database's time zone.
        stamp = payload["resource"]["updated_at"]
        assert stamp.endswith("+00:00"), stamp
        row = conn.execute("SELECT updated_at FROM invoices WHERE number = 'G-1'").fetchone()
        assert row is not None and datetime.fromisoformat(stamp) == row[0]
        assert payload["event"]["occurred_at"].endswith("Z")

        # The delivery log and the subscription's last delivery, through the API.
        response = await http.get(f"/api/v1/webhooks/{sid}/deliveries")
        assert response.status_code == 200, response.text
        [listed] = response.json()
        assert listed["status"] == "succeeded" and listed["last_status"] == 200
        assert RFC3339.match(listed["created_at"]) and RFC3339.match(listed["finished_at"])
        response = await http.get(f"/api/v1/webhooks/{sid}/deliveries/{listed['id']}/")
        assert response.status_code == 200, response.text
        assert response.json()["payload"] == payload
        response = await http.get(f"/api/v1/webhooks/{sid}")
        assert response.status_code == 200, response.text
        assert response.json()["last_status"] == 200
        assert RFC3339.match(response.json()["last_success_at"])


def test_status_under_hostile_defaults(hostile: str, conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO webhooks.worker_tasks (worker, task, restarts, last_error,"
                 " last_crash_at) VALUES ('host:1:1', 'listener', 2, 'RuntimeError: boom',"
                 " now() - interval '2 minutes')")
    env = {**os.environ, "DATABASE_URL": hostile}
    done = subprocess.run([sys.executable, "-m", "service", "status", "--json"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [t["restarts"] for t in data["worker_tasks"]] == [2]
    # Partition bounds in ISO and UTC: each day starts at midnight UTC.
    oldest = [p["oldest"] for p in data["partitions"]]
    assert oldest and all(re.fullmatch(r"\d{4}-\d\d-\d\d 00:00:00\+00", o) for o in oldest)
    done = subprocess.run([sys.executable, "-m", "service", "status"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "listener  2 restarts" in done.stdout


def test_migrate_under_hostile_defaults(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        make_hostile(conn, empty_db)
    assert db.migrate(empty_db)  # every migration, on a new database
    assert db.migrate(empty_db) == []  # yoyo finds what it recorded
    with psycopg.connect(empty_db, autocommit=True, options="-c default_transaction_read_only"
                         "=off") as conn:
        assert conn.execute("SELECT count(*) FROM webhooks._yoyo_migration").fetchone() != (0,)
        # The functions were installed as written (standard_conforming_strings was off).
        assert conn.execute("SELECT count(*) FROM webhooks.queue_partitions"
                            " WHERE parent = 'deliveries'").fetchone() == (3,)


# --- retention ---------------------------------------------------------------------

WEEK = 7 * 86400.0


def seed_day(conn: psycopg.Connection, sid: int, days_ago: int, n: int, *,
             finished_ago: str | None = None) -> None:
    """n finished deliveries (with their events) made `days_ago` days ago, finished then
    or `finished_ago` (an interval) ago, in that day's partitions."""
    conn.execute("SELECT webhooks.ensure_partitions(now() - make_interval(days => %s),"
                 " now() - make_interval(days => %s))", (days_ago, days_ago))
    conn.execute(
        "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body,"
        "                                      created_at)"
        "  SELECT nextval('webhooks.event_ids'), 'invoices', 'invoice.create', t, '{}', t"
        "    FROM generate_series(1, %(n)s),"
        "         LATERAL (SELECT now() - make_interval(days => %(ago)s)) AS x (t)"
        "  RETURNING id, created_at)"
        " INSERT INTO webhooks.deliveries (event_id, subscription_id, status, attempts,"
        "                                 created_at, finished_at)"
        " SELECT e.id, %(sid)s, 'succeeded', 1, e.created_at,"
        "        coalesce(now() - %(finished)s::interval, e.created_at) FROM e",
        {"n": n, "ago": days_ago, "sid": sid, "finished": finished_ago})


def deliveries_partitions(conn: psycopg.Connection) -> list[tuple[str, datetime, datetime]]:
    return conn.execute("SELECT partition, lower_bound, upper_bound FROM webhooks.queue_partitions"
                        " WHERE parent = 'deliveries' ORDER BY lower_bound").fetchall()


async def test_retention_under_hostile_defaults_keeps_a_requeued_delivery(
        hostile: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delivery requeued between the choice and the detach: the detached partition goes
    back with its own bounds, and the delivery stays in the queue."""
    sid, _ = subscribe(conn)
    seed_day(conn, sid, 10, 20)
    before = deliveries_partitions(conn)
    chosen: list[dict[str, Any]] = []
    real_drop = pruning._drop

    async def requeue_then_drop(s: Any, part: dict[str, Any], retention: float) -> bool:
        if part["parent"] == "deliveries" and not chosen:
            chosen.append(part)
            conn.execute("SELECT webhooks.redeliver(min(id)) FROM webhooks.deliveries")
        return await real_drop(s, part, retention)

    monkeypatch.setattr(pruning, "_drop", requeue_then_drop)
    async with open_pool(hostile) as pool:
        assert await prune(Store(pool), retention=WEEK) == 0
    assert chosen
    assert deliveries_partitions(conn) == before
    assert conn.execute("SELECT count(*), count(*) FILTER (WHERE status = 'pending')"
                        " FROM webhooks.deliveries").fetchone() == (20, 1)


def test_retention_bounds_go_back_as_they_came_in_any_session(
        db_url: str, conn: psycopg.Connection) -> None:
    """Retention's two queries, run in a session with its own time zone and date style
    (the service's own sessions set theirs): the bounds the first returns put a detached
    partition back exactly where it was."""
    sid, _ = subscribe(conn)
    seed_day(conn, sid, 10, 5)
    before = deliveries_partitions(conn)
    with psycopg.connect(db_url, autocommit=True, options=WRITER) as dba, \
            dba.cursor(row_factory=dict_row) as cur:
        parts = cur.execute(db.query("partitions_expired"), {"retention": WEEK}).fetchall()
        part = next(p for p in parts if p["parent"] == "deliveries")
        conn.execute("SELECT webhooks.redeliver(min(id)) FROM webhooks.deliveries")
        cur.execute(psycopg.sql.SQL("ALTER TABLE webhooks.deliveries DETACH PARTITION {}")
                    .format(psycopg.sql.Identifier("webhooks", part["partition"])))
        kept = cur.execute(db.query("partitions_keep_detached"),
                           {**part, "retention": WEEK}).fetchone()
        assert kept == {"kept": True}
    assert deliveries_partitions(conn) == before
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries WHERE status = 'pending'"
                        ).fetchone() == (1,)


def test_a_dba_session_sees_the_partitions_as_they_are(
        db_url: str, conn: psycopg.Connection) -> None:
    """The retention functions called from a DBA's psql with its own time zone, date
    style and string syntax answer as from the service's sessions."""
    sid, _ = subscribe(conn)
    # Made ten days ago, finished an hour inside the week's retention: the day is busy.
    seed_day(conn, sid, 10, 3, finished_ago="6 days 23 hours")
    name = deliveries_partitions(conn)[0][0]
    conn.execute("SELECT webhooks.ensure_partitions(now(), now() + interval '2 days')")
    count = "SELECT count(*) FROM webhooks.queue_partitions WHERE parent = 'deliveries'"
    made = conn.execute(count).fetchone()
    with psycopg.connect(db_url, autocommit=True, options=WRITER) as dba:
        assert dba.execute("SELECT webhooks.deliveries_partition_busy(%s, now() - interval"
                           " '7 days')", (name,)).fetchone() == (True,)
        assert dba.execute("SELECT count(*) FROM webhooks.expired_partitions('7 days')"
                           " WHERE parent = 'deliveries'").fetchone() == (0,)
        assert dba.execute("SELECT webhooks.ensure_partitions(now(), now() + interval"
                           " '2 days')").fetchone() == (0,)
        assert dba.execute(count).fetchone() == made


# --- capture ---------------------------------------------------------------------------

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
