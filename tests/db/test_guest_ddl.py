"""A good guest: installing the service changes nothing for the database's other roles.
An application role with no rights on schema webhooks creates, alters and drops its own
tables as before; as the owner of an attached table it adds columns (they are sent), is
refused only a rename or drop of a column the attachment names, and drops the table (it
is detached). The event triggers that do this run the service's code only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from service import db
from tests.db.test_capture import outbox
from tests.support.subscriptions import subscribe_to


def create_role(conn: psycopg.Connection, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    return name


def drop_role(url: str, name: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def app(db_url: str, conn: psycopg.Connection) -> Iterator[str]:
    """An application role that may create tables in public and has no rights on the
    schema webhooks (as any role the service did not make)."""
    name = create_role(conn, "app")
    conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        drop_role(db_url, name)


@pytest.fixture
def as_app(db_url: str, app: str) -> Iterator[psycopg.Connection]:
    """A connection logged in as the application role."""
    with psycopg.connect(db_url, user=app, autocommit=True) as connection:
        yield connection


ITEMS = """
CREATE TABLE public.items (id bigint PRIMARY KEY, tenant_id text NOT NULL, name text,
                           secret text);
"""


@pytest.fixture
def attached(conn: psycopg.Connection, as_app: psycopg.Connection) -> psycopg.Connection:
    """public.items, owned by the application role and attached by the service's role,
    with a subscription to its events."""
    as_app.execute(ITEMS)
    conn.execute("SELECT webhooks.attach('public.items', 'items', 'item', "
                 "tenant_column => 'tenant_id', exclude_columns => ARRAY['secret'])")
    subscribe_to(conn, "items", ["item.create", "item.update", "item.delete"])
    return as_app


def capture_triggers(conn: psycopg.Connection, table: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname LIKE 'webhooks%%'"
        " ORDER BY tgname", (table,)).fetchall()]


def test_a_role_without_rights_on_webhooks_alters_and_drops_its_own_tables(
        conn: psycopg.Connection, as_app: psycopg.Connection, app: str) -> None:
    # Installed by a superuser, the service's event triggers fire for every role's DDL.
    assert conn.execute("SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'webhooks%'"
                        ).fetchone() == (4,)
    other = create_role(conn, "app_other")
    try:
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(other), sql.Identifier(app)))
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(
            sql.Identifier(other)))
        assert as_app.execute("SELECT has_schema_privilege('webhooks', 'USAGE')"
                              ).fetchone() == (False,)
        for statement in [
            "CREATE TABLE public.notes (id int PRIMARY KEY, body text)",
            "ALTER TABLE public.notes ADD COLUMN author text",
            "ALTER TABLE public.notes RENAME COLUMN body TO text",
            "ALTER TABLE public.notes ALTER COLUMN author TYPE varchar(100)",
            "ALTER TABLE public.notes DROP COLUMN author",
            "CREATE INDEX notes_text ON public.notes (text)",
            "ALTER TABLE public.notes SET (fillfactor = 90)",
            "ALTER TABLE public.notes RENAME TO jottings",
            sql.SQL("ALTER TABLE public.jottings OWNER TO {}").format(sql.Identifier(other)),
            "DROP TABLE public.jottings",
            "CREATE TABLE public.scratch (id int)",
            "DROP TABLE public.scratch",
        ]:
            as_app.execute(statement)  # type: ignore[arg-type]
        # Nothing of the service was put on the application's tables.
        assert conn.execute("SELECT count(*) FROM webhooks.attachments").fetchone() == (2,)
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(other)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(other)))


def test_the_owner_of_an_attached_table_adds_a_column_and_it_is_sent(
        conn: psycopg.Connection, attached: psycopg.Connection) -> None:
    as_app = attached
    as_app.execute("ALTER TABLE public.items ADD COLUMN colour text DEFAULT 'red'")
    as_app.execute("CREATE INDEX items_name ON public.items (name)")
    as_app.execute("ALTER TABLE public.items SET (fillfactor = 80)")
    as_app.execute("INSERT INTO public.items (id, tenant_id, name, secret) "
                   "VALUES (1, 'acme', 'one', 'hush')")
    as_app.execute("UPDATE public.items SET colour = 'blue'")
    created, updated = [r for r in outbox(conn) if r["resource"] == "items"]
    assert created["row_data"] == {"id": 1, "tenant_id": "acme", "name": "one",
                                   "colour": "red"}
    assert created["tenant"] == "acme"
    assert updated["changed"] == ["colour"]
    assert capture_triggers(conn, "public.items") == [
        "webhooks_1_insert", "webhooks_2_update", "webhooks_3_delete", "webhooks_4_truncate"]


def test_the_owner_cannot_drop_or_rename_a_column_the_attachment_names(
        conn: psycopg.Connection, attached: psycopg.Connection) -> None:
    as_app = attached
    for statement in ["ALTER TABLE public.items DROP COLUMN tenant_id",
                      "ALTER TABLE public.items DROP COLUMN secret",
                      "ALTER TABLE public.items RENAME COLUMN secret TO shown"]:
        with pytest.raises(psycopg.errors.UndefinedColumn) as raised:
            as_app.execute(statement)
        assert raised.value.diag.message_hint is not None
        assert "webhooks.attach" in raised.value.diag.message_hint
    # Refused means unchanged: the columns are there and the row still leaves without them.
    as_app.execute("INSERT INTO public.items VALUES (1, 'acme', 'one', 'hush')")
    assert outbox(conn)[-1]["row_data"] == {"id": 1, "tenant_id": "acme", "name": "one"}


def test_the_owner_drops_an_attached_table_and_it_is_detached(
        conn: psycopg.Connection, attached: psycopg.Connection) -> None:
    as_app = attached
    attachment = conn.execute("SELECT id FROM webhooks.attachments "
                              "WHERE table_oid = 'public.items'::regclass").fetchone()
    assert attachment is not None
    as_app.execute("DROP TABLE public.items")
    assert conn.execute("SELECT count(*) FROM webhooks.attachments "
                        "WHERE resource = 'items'").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM webhooks.hook_events "
                        "WHERE resource = 'items'").fetchone() == (0,)
    assert conn.execute("SELECT to_regproc(%s)", (f"webhooks.capture_{attachment[0]}",)
                        ).fetchone() == (None,)


def test_the_event_triggers_run_none_of_the_ddl_roles_code(
        conn: psycopg.Connection, attached: psycopg.Connection, app: str) -> None:
    # The owner plants functions and an operator under names the event triggers use, in
    # a schema on everyone's search_path, each recording who ran it.
    as_app = attached
    as_app.execute("""
        CREATE TABLE public.loot (who text);
        GRANT INSERT ON public.loot TO PUBLIC;
        CREATE FUNCTION public.format(text, regclass, text) RETURNS text LANGUAGE plpgsql AS $f$
        BEGIN INSERT INTO public.loot VALUES (current_user); RETURN 'x'; END $f$;
        CREATE FUNCTION public.format(text, text) RETURNS text LANGUAGE plpgsql AS $f$
        BEGIN INSERT INTO public.loot VALUES (current_user); RETURN 'x'; END $f$;
        CREATE FUNCTION public.quote_ident(text) RETURNS text LANGUAGE plpgsql AS $f$
        BEGIN INSERT INTO public.loot VALUES (current_user); RETURN 'x'; END $f$;
        CREATE FUNCTION public.oideq(regclass, oid) RETURNS boolean LANGUAGE plpgsql AS $f$
        BEGIN INSERT INTO public.loot VALUES (current_user); RETURN true; END $f$;
        CREATE OPERATOR public.= (LEFTARG = regclass, RIGHTARG = oid, FUNCTION = public.oideq);
        CREATE FUNCTION public.install_capture(regclass) RETURNS void LANGUAGE plpgsql AS $f$
        BEGIN INSERT INTO public.loot VALUES (current_user); END $f$;
    """)
    with as_app.transaction():
        as_app.execute("SET LOCAL search_path = public, pg_catalog")
        as_app.execute("ALTER TABLE public.items ADD COLUMN colour text")
        as_app.execute("CREATE TABLE public.other (id int)")
        as_app.execute("ALTER TABLE public.other ADD COLUMN x int")
        as_app.execute("DROP TABLE public.other")
    assert conn.execute("SELECT count(*) FROM public.loot").fetchone() == (0,)
    # Nor can the role call them, or the function that writes capture functions.
    for call in ["SELECT webhooks.install_capture('public.items')",
                 "SELECT webhooks.on_alter_table()"]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            as_app.execute(call)


def test_a_service_role_that_is_not_a_superuser_installs_without_event_triggers(
        empty_db: str) -> None:
    # Where the migrating role cannot make event triggers, migrate warns and the
    # application's DDL runs untouched, attached table or not.
    with psycopg.connect(empty_db, autocommit=True) as conn:
        service = create_role(conn, "svc")
        app = create_role(conn, "app")
        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
            sql.Identifier(conn.info.dbname), sql.Identifier(service)))
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(app)))
    try:
        parts = urlsplit(empty_db)
        service_url = urlunsplit(parts._replace(netloc=f"{service}@{parts.hostname}:{parts.port}"))
        notices: list[str] = []
        db.migrate(service_url)
        with psycopg.connect(service_url, autocommit=True) as conn:
            conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
            conn.execute(db.SQL_DIR.joinpath("triggers", "capture.sql").read_bytes())
            assert any("not a superuser" in n for n in notices), notices
            assert conn.execute("SELECT count(*) FROM pg_event_trigger").fetchone() == (0,)
            with psycopg.connect(empty_db, user=app, autocommit=True) as as_app:
                as_app.execute("CREATE TABLE public.items (tenant_id text, id int, name text,"
                               " PRIMARY KEY (tenant_id, id))")
                as_app.execute(sql.SQL("GRANT ALL ON public.items TO {}").format(
                    sql.Identifier(service)))
                conn.execute("SELECT webhooks.attach('public.items', 'items', 'item', "
                             "tenant_column => 'tenant_id', include_previous => true)")
                subscribe_to(conn, "items", ["item.update"])
                as_app.execute("ALTER TABLE public.items ADD COLUMN colour text")
                as_app.execute("INSERT INTO public.items VALUES ('a', 1, 'x'), ('b', 1, 'y')")
                as_app.execute("UPDATE public.items SET name = upper(name)")
                # Updates pair by the key here too, the service's role owning no event trigger.
                assert sorted((r["tenant"], r["previous"]["name"]) for r in outbox(conn)) == [
                    ("a", "x"), ("b", "y")]
                as_app.execute("DROP TABLE public.items")
    finally:
        with psycopg.connect(empty_db, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO CURRENT_USER").format(
                sql.Identifier(conn.info.dbname)))
        drop_role(empty_db, app)
        drop_role(empty_db, service)
