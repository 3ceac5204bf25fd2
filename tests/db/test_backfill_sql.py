"""The backfill's SQL (sql/backfill.sql: webhooks.start_backfill, backfill_step,
fail_backfill) called directly, as a worker's batches call it: a batch and its cursor
commit together, one worker at a time; ids of the built-in types are read in order; only
the attached table is read, never the rows of tables that inherit from it; no row-level
security policy is ever run; a row that cannot become JSON fails the backfill with its
reason; the functions are not public; `webhooks status` shows running and failed
backfills. Snapshots delivered by a worker and the API's side: tests/e2e/test_backfill.py;
fairness between owners: tests/db/test_backfill_fairness.py."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from service.commands import status
from tests.support.backfills import backfill_status
from tests.support.notes import bodies, make_notes
from tests.support.subscriptions import subscribe


def test_a_batch_and_its_cursor_commit_together(conn: psycopg.Connection, db_url: str) -> None:
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'T' || g, 'c', 1 FROM generate_series(1, 10) g")
    sid, _ = subscribe(conn, events=["invoice.create"])
    [(bid,)] = conn.execute("SELECT webhooks.start_backfill(%s)", (sid,)).fetchall()
    step = "SELECT * FROM webhooks.backfill_step(4, 262144)"
    # A worker that dies before its commit leaves nothing behind.
    with pytest.raises(RuntimeError), conn.transaction():
        assert conn.execute(step).fetchone() == (bid, sid, "running", 4, 4)
        raise RuntimeError("killed")
    assert conn.execute("SELECT count(*) FROM webhooks.events").fetchone() == (0,)
    assert conn.execute("SELECT cursor FROM webhooks.backfill_tables").fetchone() == (None,)
    # While one worker runs a batch, another skips the backfill rather than run it too.
    with psycopg.connect(db_url, autocommit=True) as other, conn.transaction():
        assert conn.execute(step).fetchone() == (bid, sid, "running", 4, 4)
        assert other.execute(step).fetchone() is None
    # Committed: the cursor moved with the deliveries; the next batch waits for the first
    # delivery of this one (the gate), then goes on after the cursor.
    assert conn.execute("SELECT cursor FROM webhooks.backfill_tables").fetchone() == ("4",)
    assert conn.execute(step).fetchone() is None
    conn.execute("UPDATE webhooks.deliveries SET status = 'succeeded'")
    assert conn.execute(step).fetchone() == (bid, sid, "running", 8, 4)
    conn.execute("UPDATE webhooks.deliveries SET status = 'succeeded'")
    assert conn.execute(step).fetchone() == (bid, sid, "done", 10, 2)
    ids = [r[0] for r in conn.execute(
        "SELECT (body::jsonb -> 'event' ->> 'resource_id')::int FROM webhooks.events"
        " ORDER BY id").fetchall()]
    assert ids == list(range(1, 11))


def test_functions_are_not_public(conn: psycopg.Connection) -> None:
    for function in ("start_backfill(bigint, integer)", "backfill_step(integer, integer, integer)",
                     "backfill_sql(webhooks.attachments, boolean, boolean)",
                     "backfill_problem(webhooks.attachments)",
                     "fail_backfill(bigint, text)", "backfill_json(webhooks.backfills)"):
        row = conn.execute("SELECT has_function_privilege('public', %s, 'EXECUTE'),"
                           " (SELECT proconfig FROM pg_proc WHERE oid = %s::regprocedure)",
                           (f"webhooks.{function}", f"webhooks.{function}")).fetchone()
        assert row is not None and row[0] is False, function
        assert any(c.startswith("search_path=pg_catalog") for c in row[1] or []), function


def test_status_shows_running_and_failed_backfills(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'S' || g, 'c', 1 FROM generate_series(1, 3) g")
    sid, _ = subscribe(conn, events=["invoice.create", "payment.create"])
    [(bid,)] = conn.execute("SELECT webhooks.start_backfill(%s)", (sid,)).fetchall()
    conn.execute("SELECT * FROM webhooks.backfill_step(2, 262144)")
    data = status.collect(conn)
    [shown] = data["backfills"]
    assert (shown["id"], shown["subscription_id"], shown["status"], shown["rows"]) == \
        (bid, sid, "running", 2)
    text = status.render(data)
    assert f"#{bid}" in text and "invoices 2 (after id 2), payments 0 (waiting)" in text
    assert '"backfills"' in json.dumps(data, default=str)
    conn.execute("SELECT webhooks.fail_backfill(%s, 'table public.invoices: no luck')", (bid,))
    text = status.render(status.collect(conn))
    assert "failed: table public.invoices: no luck" in text


def test_row_level_security_policies_are_never_run(conn: psycopg.Connection) -> None:
    # A table whose owner wrote a policy: a backfill that read it as a role subject to the
    # policy would run the owner's expression with the service's rights. It is refused.
    role = f"webhooks_svc_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE ROLE {role}")
    try:
        conn.execute(f"GRANT USAGE ON SCHEMA webhooks TO {role};"
                     f"GRANT ALL ON ALL TABLES IN SCHEMA webhooks TO {role};"
                     f"GRANT ALL ON ALL SEQUENCES IN SCHEMA webhooks TO {role};"
                     f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA webhooks TO {role};"
                     f"GRANT SELECT ON invoices TO {role};")
        # Where no event trigger refuses a policy on an attached table (the guard's are off
        # in a replica session), the backfill still never runs it.
        conn.execute("SET session_replication_role = replica;"
                     "ALTER TABLE invoices ENABLE ROW LEVEL SECURITY;"
                     "CREATE POLICY mine ON invoices USING (company_id = current_user);"
                     "RESET session_replication_role")
        sid, _ = subscribe(conn, events=["invoice.create"])
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="row-level security"):
            conn.execute(f"SET ROLE {role}; SELECT webhooks.start_backfill({sid})")
        conn.execute("RESET ROLE")
        # Without policies, the same role backfills.
        conn.execute("ALTER TABLE invoices DISABLE ROW LEVEL SECURITY")
        conn.execute(f"SET ROLE {role}")
        [(bid,)] = conn.execute("SELECT webhooks.start_backfill(%s)", (sid,)).fetchall()
        assert bid is not None
    finally:
        conn.execute("RESET ROLE")
        conn.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_a_row_that_cannot_become_json_fails_the_backfill_with_its_reason(
        conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE public.notes (id bigint PRIMARY KEY, body json);"
                 "INSERT INTO public.notes VALUES (1, '{\"a\": 1}'), (2, '\"\\u0000\"');"
                 "SELECT webhooks.attach('public.notes', resource => 'notes', noun => 'note')")
    sid, _ = subscribe(conn, resource="notes", events=["note.create"])
    [(bid,)] = conn.execute("SELECT webhooks.start_backfill(%s)", (sid,)).fetchall()
    assert conn.execute("SELECT status FROM webhooks.backfill_step(10, 262144)"
                        ).fetchone() == ("failed",)
    [(status_, error, rows)] = conn.execute(
        "SELECT status, error, rows FROM webhooks.backfills WHERE id = %s", (bid,)).fetchall()
    assert status_ == "failed" and rows == 0
    assert error.startswith("table public.notes, the first rows: unsupported Unicode"), error
    assert "\\u0000" in error, error
    # Nothing of the failed batch was queued.
    assert conn.execute("SELECT count(*) FROM webhooks.events").fetchone() == (0,)


def run_to_the_end(conn: psycopg.Connection, bid: int, batch: int) -> list[Any]:
    """Runs batches of `batch` rows (each delivery succeeding at once) until the backfill is
    over; the resource_ids queued, in event order."""
    for _ in range(1000):
        conn.execute("UPDATE webhooks.deliveries SET status = 'succeeded'")
        row = conn.execute("SELECT status FROM webhooks.backfill_step(%s, 262144)",
                           (batch,)).fetchone()
        if row is not None and row[0] != "running":
            break
    assert backfill_status(conn, bid) == "done"
    return [r[0] for r in conn.execute(
        "SELECT body::jsonb -> 'event' -> 'resource_id' FROM webhooks.events ORDER BY id")]


@pytest.mark.parametrize(("column", "values"), [
    ("uuid", "gen_random_uuid() FROM generate_series(1, 25)"),
    ("text", "'k' || g FROM generate_series(1, 25) g"),
    ("timestamptz", "'2026-01-01 00:00:00.123456+05:30'::timestamptz + g * interval '1.5 s'"
                    " FROM generate_series(1, 25) g"),
    ("float8", "g / 3.0 FROM generate_series(1, 25) g"),
    # Not unique: equal ids never straddle two batches, so none is skipped.
    ("integer", "g / 4 FROM generate_series(1, 25) g"),
])
def test_id_columns_of_built_in_types(conn: psycopg.Connection, column: str,
                                      values: str) -> None:
    conn.execute(f"CREATE TABLE public.things (id {column}, n serial, PRIMARY KEY (id, n));"
                 f"INSERT INTO public.things (id) SELECT {values};"
                 "SELECT webhooks.attach('public.things', resource => 'things', noun => 'thing')")
    expected = [r[0] for r in conn.execute(
        "SELECT to_jsonb(id) FROM public.things ORDER BY id, n")]
    sid, _ = subscribe(conn, resource="things", events=["thing.create"])
    [(bid,)] = conn.execute("SELECT webhooks.start_backfill(%s)", (sid,)).fetchall()
    queued = run_to_the_end(conn, bid, 4)
    # Every row once, in id order.
    assert queued == expected


def test_backfill_leaves_out_the_rows_of_inheriting_tables(conn: psycopg.Connection) -> None:
    make_notes(conn)
    conn.execute("CREATE TABLE pinned_notes (pinned boolean) INHERITS (notes)")
    conn.execute("INSERT INTO notes SELECT i, 'n' || i FROM generate_series(1, 3) AS i")
    conn.execute("INSERT INTO pinned_notes (id, body) SELECT i, 'p' || i "
                 "FROM generate_series(100, 104) AS i")
    sid, _ = subscribe(conn, resource="notes", events=["note.create"])
    conn.execute("SELECT webhooks.start_backfill(%s)", (sid,))
    for _ in range(10):
        row = conn.execute("SELECT status FROM webhooks.backfill_step(2, 262144, 5000)"
                           ).fetchone()
        if row is None or row[0] != "running":
            break
    assert conn.execute("SELECT status, rows FROM webhooks.backfills").fetchone() == ("done", 3)
    ids = sorted(b["event"]["resource_id"] for b in bodies(conn, "note.snapshot"))
    assert ids == [1, 2, 3]
