"""A reshaped table lends no rights: the owner of an attached table, an ordinary role with
no rights on schema webhooks, cannot make the service run its code. Where event triggers
are installed the statements that would change what reading the table runs or how its
rows pair are refused; where they are not (a managed PostgreSQL), every read checks the
table first, reads nothing of one turned into a view, and detaches it, saying why."""

from __future__ import annotations

import psycopg
import pytest

from service import db
from tests.db.test_guest_ddl import app, as_app, attached  # noqa: F401  (fixtures)
from tests.support.subscriptions import subscribe_to

# The function a hostile owner wants the service to run: it records who ran it.
EVIL = """
CREATE TABLE public.evil_log (ran_as text, superuser boolean);
GRANT INSERT ON public.evil_log TO PUBLIC;
CREATE FUNCTION public.evil() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.evil_log
    SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
    RETURN 1;
END $$;
"""

# The finding, step by step: a second unique index so that the primary key may go, then
# that index, the capture triggers and the rows, then the rule that makes it a view.
VIEW_STEPS = [
    "CREATE UNIQUE INDEX items_u ON public.items (id)",
    "ALTER TABLE public.items DROP CONSTRAINT items_pkey",
    "DROP INDEX public.items_u",
    "DROP TRIGGER webhooks_1_insert ON public.items",
    "DROP TRIGGER webhooks_2_update ON public.items",
    "DROP TRIGGER webhooks_3_delete ON public.items",
    "DROP TRIGGER webhooks_4_truncate ON public.items",
    "DELETE FROM public.items",
]
RULE = ('CREATE RULE "_RETURN" AS ON SELECT TO public.items DO INSTEAD '
        "SELECT public.evil() AS id, 'a'::text AS tenant_id, 'n'::text AS name, "
        "'s'::text AS secret")


def refused(connection: psycopg.Connection, statement: str) -> str:
    """The hint of the error that refuses `statement`."""
    with pytest.raises(psycopg.errors.InvalidTableDefinition) as raised:
        connection.execute(statement)
    return raised.value.diag.message_hint or ""


def build_view(conn: psycopg.Connection, owner: psycopg.Connection) -> None:
    """Turns the attached public.items into a view running public.evil(), as its owner,
    with the event triggers off (as on a server where the service could not install them)."""
    conn.execute(EVIL)
    for name in ("webhooks_alter_table", "webhooks_drop", "webhooks_guard",
                 "webhooks_drop_guard"):
        conn.execute(f"ALTER EVENT TRIGGER {name} DISABLE")
    owner.execute("INSERT INTO public.items VALUES (1, 'a', 'ann', 's')")
    for statement in VIEW_STEPS:
        owner.execute(statement)
    conn.execute("VACUUM public.items")  # clears the table's has-triggers and has-index flags
    owner.execute(RULE)
    assert conn.execute("SELECT relkind FROM pg_class WHERE oid = 'public.items'::regclass"
                        ).fetchone() == ("v",)


def evil_runs(conn: psycopg.Connection) -> list[tuple[str, bool]]:
    return conn.execute("SELECT ran_as, superuser FROM public.evil_log").fetchall()


def test_the_guard_refuses_every_step_that_reshapes_an_attached_table(
        conn: psycopg.Connection, attached: psycopg.Connection) -> None:  # noqa: F811
    owner = attached
    owner.execute("CREATE UNIQUE INDEX items_u ON public.items (id)")
    assert "webhooks.detach" in refused(owner, "ALTER TABLE public.items DROP CONSTRAINT "
                                                "items_pkey")
    for statement in [
        "DROP TRIGGER webhooks_1_insert ON public.items",
        "ALTER TRIGGER webhooks_2_update ON public.items RENAME TO mine",
        "CREATE RULE quiet AS ON INSERT TO public.items DO INSTEAD NOTHING",
        "ALTER TABLE public.items ENABLE ROW LEVEL SECURITY",
        "CREATE POLICY everyone ON public.items USING (true)",
    ]:
        assert "webhooks.detach" in refused(owner, statement), statement
    # Nothing changed: the key, the four triggers, no rule, no policy.
    assert conn.execute("SELECT key_columns, key_index::text FROM webhooks.attachments"
                        " WHERE table_oid = 'public.items'::regclass").fetchone() == (
        ["id"], "items_pkey")
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.items'"
                        "::regclass AND tgname LIKE 'webhooks%'").fetchone() == (4,)
    assert conn.execute("SELECT count(*) FROM pg_rewrite WHERE ev_class = 'public.items'"
                        "::regclass").fetchone() == (0,)
    assert conn.execute("SELECT relrowsecurity FROM pg_class WHERE oid = 'public.items'"
                        "::regclass").fetchone() == (False,)
    # What does not touch the key, the triggers or what reading runs still works.
    owner.execute("DROP INDEX public.items_u")
    owner.execute("ALTER TABLE public.items ADD COLUMN colour text")
    # A key replaced in the transaction that drops the old one pairs the rows from then on.
    with owner.transaction():
        owner.execute("CREATE UNIQUE INDEX items_tenant_id ON public.items (tenant_id, id)")
        owner.execute("ALTER TABLE public.items DROP CONSTRAINT items_pkey")
    assert conn.execute("SELECT key_columns FROM webhooks.attachments"
                        " WHERE table_oid = 'public.items'::regclass").fetchone() == (
        ["tenant_id", "id"],)


def test_other_tables_keep_their_rules_policies_and_triggers(
        conn: psycopg.Connection, attached: psycopg.Connection) -> None:  # noqa: F811
    owner = attached
    for statement in [
        "CREATE TABLE public.notes (id int PRIMARY KEY, body text)",
        "CREATE RULE quiet AS ON INSERT TO public.notes DO INSTEAD NOTHING",
        "ALTER TABLE public.notes ENABLE ROW LEVEL SECURITY",
        "CREATE POLICY everyone ON public.notes USING (true)",
        "CREATE FUNCTION public.nothing() RETURNS trigger LANGUAGE plpgsql AS "
        "$$BEGIN RETURN NULL; END$$",
        "CREATE TRIGGER webhooks_1_insert AFTER INSERT ON public.notes "
        "FOR EACH STATEMENT EXECUTE FUNCTION public.nothing()",
        "DROP TRIGGER webhooks_1_insert ON public.notes",
        "ALTER TABLE public.notes DROP CONSTRAINT notes_pkey",
        "DROP TABLE public.notes",
    ]:
        owner.execute(statement)
    # The service's own DDL on the attached table passes: detach drops its triggers.
    conn.execute("SELECT webhooks.detach('public.items')")
    assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.items'"
                        "::regclass").fetchone() == (0,)


def test_a_table_turned_into_a_view_is_never_read(
        conn: psycopg.Connection, attached: psycopg.Connection) -> None:  # noqa: F811
    sid = conn.execute("SELECT id FROM webhooks.subscriptions").fetchone()[0]
    build_view(conn, attached)
    # The API's check before a backfill: nothing read, the table detached with its reason.
    [(problem,)] = conn.execute("SELECT webhooks.check_backfill_tables(%s)", (sid,)).fetchall()
    assert "is no longer a table (it is a view)" in problem
    assert evil_runs(conn) == []
    assert conn.execute("SELECT count(*) FROM webhooks.attachments"
                        " WHERE table_oid::text = 'public.items'").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM webhooks.hook_events WHERE resource = 'items'"
                        ).fetchone() == (0,)
    active, reason = conn.execute("SELECT active, inactive_reason FROM webhooks.subscriptions"
                                  " WHERE id = %s", (sid,)).fetchone()
    assert not active and "public.items is no longer a table" in reason


def test_a_backfill_started_before_the_reshape_fails_and_reads_nothing(
        conn: psycopg.Connection, attached: psycopg.Connection) -> None:  # noqa: F811
    sid = conn.execute("SELECT id FROM webhooks.subscriptions").fetchone()[0]
    [(bid,)] = conn.execute("SELECT webhooks.start_backfill(%s)", (sid,)).fetchall()
    build_view(conn, attached)
    [(status,)] = conn.execute("SELECT status FROM webhooks.backfill_step(10, 65536)"
                               ).fetchall()
    assert status == "failed"
    assert evil_runs(conn) == []
    [(error,)] = conn.execute("SELECT error FROM webhooks.backfills WHERE id = %s", (bid,)
                              ).fetchall()
    assert "is no longer a table (it is a view)" in error
    assert conn.execute("SELECT active FROM webhooks.subscriptions WHERE id = %s", (sid,)
                        ).fetchone() == (False,)
    # start_backfill, as a DBA would call it in SQL, refuses too.
    other = subscribe_to(conn, "invoices", ["invoice.create"])
    conn.execute("SELECT webhooks.start_backfill(%s)", (other,))
    assert evil_runs(conn) == []


def test_migrate_detaches_a_table_turned_into_a_view(
        db_url: str, conn: psycopg.Connection, attached: psycopg.Connection) -> None:  # noqa: F811
    build_view(conn, attached)
    db.migrate(db_url)
    assert evil_runs(conn) == []
    assert conn.execute("SELECT count(*) FROM webhooks.attachments"
                        " WHERE table_oid::text = 'public.items'").fetchone() == (0,)
    [(reason,)] = conn.execute("SELECT inactive_reason FROM webhooks.subscriptions"
                               " WHERE resource = 'items'").fetchall()
    assert "is no longer a table (it is a view)" in reason
