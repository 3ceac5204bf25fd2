"""The capture path under attack: it never runs a table owner's or writer's code with the
service's rights, produces nothing for triggers it did not install, takes any column name
as a column, sets poison rows aside, and follows or refuses schema changes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from service.filters import compile_path
from service.store import Store
from tests.db.test_capture import outbox
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe, subscribe_to
from tests.support.worker import open_pool


@pytest.fixture
def role(conn: psycopg.Connection) -> Iterator[str]:
    """An unprivileged role that owns schema `mallory` and may use schema webhooks."""
    name = f"mallory_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    conn.execute(sql.SQL("CREATE SCHEMA mallory AUTHORIZATION {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA webhooks TO {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(name)))
    conn.execute(sql.SQL("GRANT ALL ON public.invoices TO {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        conn.execute("DROP SCHEMA mallory CASCADE")
        conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def as_role(conn: psycopg.Connection, role: str, statement: str) -> None:
    with conn.transaction():
        conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
        conn.execute(statement)  # type: ignore[call-overload]


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with open_pool(db_url, max_size=4) as p:
        yield p


def deliveries(conn: psycopg.Connection, subscription_id: int) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT e.body FROM webhooks.deliveries d JOIN webhooks.events e ON e.id = d.event_id "
        "WHERE d.subscription_id = %s ORDER BY d.id", (subscription_id,)).fetchall()]


# -- rights ---------------------------------------------------------------------------

def test_a_cast_of_the_table_owner_never_runs_with_the_services_rights(
        conn: psycopg.Connection, role: str) -> None:
    # The owner of an attached table gives a column a type of its own with a cast to json
    # whose function tries to read every subscription secret.
    subscribe(conn, "http://x/", owner="victim", events=["invoice.create"],
              secret="whsec_TOPSECRET")
    as_role(conn, role, """
        CREATE TABLE mallory.loot (what text);
        CREATE TYPE mallory.mood AS ENUM ('ok', 'sad');
        CREATE FUNCTION mallory.mood_json(m mallory.mood) RETURNS json LANGUAGE plpgsql AS $f$
        BEGIN
            INSERT INTO mallory.loot SELECT current_user || ':' || coalesce(
                (SELECT string_agg(secret, ',') FROM webhooks.subscriptions), '');
            RETURN '"cast"'::json;
        EXCEPTION WHEN insufficient_privilege THEN
            INSERT INTO mallory.loot VALUES (current_user || ':denied');
            RETURN '"denied"'::json;
        END $f$;
        CREATE CAST (mallory.mood AS json) WITH FUNCTION mallory.mood_json(mallory.mood);
        CREATE TABLE public.moods (id int PRIMARY KEY, mood mallory.mood,
                                   moods mallory.mood[], tenant mallory.mood);
        GRANT INSERT, UPDATE, DELETE, SELECT ON public.moods TO PUBLIC;
    """)
    conn.execute("SELECT webhooks.attach('public.moods', resource => 'moods', noun => 'mood', "
                 "tenant_column => 'tenant')")
    subscribe_to(conn, "moods", ["mood.create", "mood.update"])
    as_role(conn, role, "INSERT INTO public.moods VALUES (1, 'sad', '{ok,sad}', 'ok')")
    as_role(conn, role, "UPDATE public.moods SET mood = 'ok'")
    loot = [r[0] for r in conn.execute("SELECT what FROM mallory.loot").fetchall()]
    assert not any("TOPSECRET" in what for what in loot), loot
    assert all(what.startswith(f"{role}:") for what in loot), loot
    created, updated = [r for r in outbox(conn) if r["resource"] == "moods"]
    assert created["row_data"] == {"id": 1, "mood": "sad", "moods": "{ok,sad}", "tenant": "ok"}
    assert created["tenant"] == "ok"
    assert updated["row_data"]["mood"] == "ok"


def test_a_planted_operator_or_function_on_the_search_path_changes_nothing(
        conn: psycopg.Connection, role: str) -> None:
    subscribe_to(conn, "invoices", ["invoice.create", "invoice.update"])
    as_role(conn, role, """
        CREATE FUNCTION mallory.texteq(text, text) RETURNS boolean LANGUAGE sql
            AS $f$ SELECT true $f$;
        CREATE OPERATOR mallory.= (LEFTARG = text, RIGHTARG = text,
                                   FUNCTION = mallory.texteq);
        CREATE FUNCTION mallory.format(text, text) RETURNS text LANGUAGE sql
            AS $f$ SELECT 'forged' $f$;
        CREATE FUNCTION mallory.current_setting(text, boolean) RETURNS text LANGUAGE sql
            AS $f$ SELECT 'forged' $f$;
        CREATE FUNCTION mallory.pg_current_xact_id() RETURNS xid8 LANGUAGE sql
            AS $f$ SELECT '1'::xid8 $f$;
    """)
    with conn.transaction():
        conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
        conn.execute("SET LOCAL search_path = mallory, pg_catalog, public")
        conn.execute("INSERT INTO public.invoices (id, number, customer, amount, company_id) "
                     "VALUES (5, 'N', 'c', 1, 'acme')")
        conn.execute("UPDATE public.invoices SET customer = 'd' WHERE id = 5")
    rows = outbox(conn)
    assert [r["name"] for r in rows] == ["invoice.create", "invoice.update"]
    assert rows[0]["row_data"]["number"] == "N" and rows[0]["tenant"] == "acme"
    assert rows[0]["user_id"] == "postgres"
    assert rows[1]["row_data"]["customer"] == "d"
    xid = conn.execute("SELECT xid FROM webhooks.outbox ORDER BY id LIMIT 1").fetchone()
    assert xid is not None and int(str(xid[0])) > 1


def test_no_function_of_the_schema_is_executable_by_an_unprivileged_role(
        conn: psycopg.Connection, role: str) -> None:
    callable_ = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p "
        "WHERE p.pronamespace = 'webhooks'::regnamespace "
        "AND has_function_privilege(%s, p.oid, 'EXECUTE')", (role,)).fetchall()
    assert callable_ == []
    # Nor any that attach generates later.
    conn.execute("CREATE TABLE public.later (id int PRIMARY KEY)")
    conn.execute("SELECT webhooks.attach('public.later', resource => 'later', noun => 'later')")
    assert conn.execute(
        "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'webhooks'::regnamespace "
        "AND has_function_privilege(%s, p.oid, 'EXECUTE')", (role,)).fetchone() == (0,)


def test_a_capture_trigger_on_another_table_cannot_be_created_or_forge_events(
        conn: psycopg.Connection, role: str) -> None:
    subscribe_to(conn, "invoices", ["invoice.create"])
    function = conn.execute(
        "SELECT 'webhooks.capture_' || id FROM webhooks.attachments "
        "WHERE resource = 'invoices'").fetchone()
    assert function is not None
    as_role(conn, role, "CREATE TABLE mallory.fake (id int, company_id text)")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_role(conn, role, f"CREATE TRIGGER forge AFTER INSERT ON mallory.fake "
                            f"REFERENCING NEW TABLE AS changed_rows FOR EACH STATEMENT "
                            f"EXECUTE FUNCTION {function[0]}()")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_role(conn, role, "SELECT webhooks.attach('mallory.fake', resource => 'fake', "
                            "noun => 'invoice')")
    # Even a trigger that a privileged role puts on another table produces nothing: the
    # function checks that the firing table is its attachment's.
    conn.execute("CREATE TABLE public.fake (id int, number text, customer text, amount int,"
                 " company_id text, status text, updated_by text, updated_at timestamptz)")
    conn.execute(f"CREATE TRIGGER forge AFTER INSERT ON public.fake "
                 f"REFERENCING NEW TABLE AS changed_rows FOR EACH STATEMENT "
                 f"EXECUTE FUNCTION {function[0]}()")
    conn.execute("INSERT INTO public.fake (id, company_id) VALUES (1, 'acme')")
    assert outbox(conn) == []


# -- column names -----------------------------------------------------------------------

def test_any_column_name_is_just_a_column(conn: psycopg.Connection) -> None:
    names = ["r", "row", "new", "c", "x", "e", "changed_rows", "old_rows", "v_rows",
             "v_name", "TG_OP", "id ", "$capture$", "a\"b", "select", "json_build_object"]
    columns = ", ".join(f"{sql.Identifier(n).as_string(conn)} text" for n in names)
    conn.execute(f"CREATE TABLE public.odd (id int PRIMARY KEY, {columns})")
    conn.execute("SELECT webhooks.attach('public.odd', resource => 'odd', noun => 'odd', "
                 "user_column => 'r', tenant_column => 'row')")
    subscribe_to(conn, "odd", ["odd.create", "odd.update"])
    values = ", ".join("%s" for _ in names)
    cols = ", ".join(sql.Identifier(n).as_string(conn) for n in names)
    conn.execute(f"INSERT INTO public.odd (id, {cols}) VALUES (7, {values})",
                 [f"value of {n}" for n in names])
    conn.execute('UPDATE public.odd SET "x" = \'changed\'')
    created, updated = outbox(conn)
    assert created["resource_id"] == 7
    assert created["row_data"] == {"id": 7, **{n: f"value of {n}" for n in names}}
    assert created["user_id"] == "value of r" and created["tenant"] == "value of row"
    assert updated["row_data"]["x"] == "changed" and updated["row_data"]["r"] == "value of r"


def test_a_table_wider_than_json_build_object_takes(conn: psycopg.Connection) -> None:
    columns = ", ".join(f"c{i} int DEFAULT {i}" for i in range(130))
    conn.execute(f"CREATE TABLE public.wide (id int PRIMARY KEY, {columns}, doc json)")
    conn.execute("SELECT webhooks.attach('public.wide', resource => 'wide', noun => 'wide', "
                 "exclude_columns => ARRAY['c5'])")
    subscribe_to(conn, "wide", ["wide.create"])
    conn.execute("""INSERT INTO public.wide (id, doc) VALUES (1, '{"a": {}}')""")
    [row] = outbox(conn)
    data = row["row_data"]
    assert "c5" not in data and data["c0"] == 0
    assert len(data) == 1 + 129 + 1 and data["c129"] == 129 and data["doc"] == {"a": {}}


# -- poison rows ------------------------------------------------------------------------

@pytest.fixture
def docs(conn: psycopg.Connection) -> int:
    conn.execute("CREATE TABLE public.docs (id int PRIMARY KEY, body json, tag text)")
    conn.execute("SELECT webhooks.attach('public.docs', resource => 'docs', noun => 'doc')")
    return subscribe_to(conn, "docs", ["doc.create", "doc.update"])


@pytest.mark.parametrize("poison", [r'{"a": "\u0000"}', r'"\ud800"', r'["x\udfff"]'])
async def test_a_poison_row_is_set_aside_and_nothing_else_is_blocked(
        conn: psycopg.Connection, pool: AsyncConnectionPool, docs: int, poison: str) -> None:
    conn.execute("INSERT INTO public.docs VALUES (1, '{}', 'before')")
    # One statement with a good and a poison row, then the application updates the
    # poison row itself: nothing it does fails.
    conn.execute("INSERT INTO public.docs VALUES (2, %s, 'poison'), (3, '[1]', 'good')",
                 (poison,))
    conn.execute("UPDATE public.docs SET tag = 'still poison' WHERE id = 2")
    conn.execute("INSERT INTO public.docs VALUES (4, '{}', 'after')")
    drained = await drain_outbox(Store(pool), 100)
    assert drained.rejected == 2
    bodies = deliveries(conn, docs)
    tags = [body.split('"tag": ')[1].split('"')[1] for body in bodies]
    assert tags == ["before", "good", "after"]
    rejected = conn.execute("SELECT table_name, event, reason, row_text "
                            "FROM webhooks.rejected_changes ORDER BY id").fetchall()
    assert [(r[0], r[1]) for r in rejected] == [("public.docs", "doc.create"),
                                                 ("public.docs", "doc.update")]
    assert all("Unicode" in r[2] or "unicode" in r[2] for r in rejected), rejected
    assert '"poison"' in rejected[0][3] and '"still poison"' in rejected[1][3]
    assert conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone() == (0,)


# -- schema changes -----------------------------------------------------------------------

def test_renaming_or_dropping_a_named_column_is_refused(conn: psycopg.Connection) -> None:
    for ddl in ("ALTER TABLE payments RENAME card_token TO card_token_enc",
                "ALTER TABLE payments DROP COLUMN card_token",
                "ALTER TABLE payments RENAME COLUMN invoice_id TO invoice",
                "ALTER TABLE payments RENAME company_id TO tenant",
                "ALTER TABLE invoices DROP COLUMN id CASCADE"):
        with pytest.raises(psycopg.errors.UndefinedColumn) as error:
            conn.execute(ddl)
        assert "webhooks.attach" in (error.value.diag.message_hint or ""), ddl
    names = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'payments'::regclass "
        "AND attnum > 0 AND NOT attisdropped").fetchall()]
    assert "card_token" in names and "invoice_id" in names


def test_other_schema_changes_are_followed(conn: psycopg.Connection) -> None:
    subscribe_to(conn, "invoices", ["payment.create"])
    conn.execute("INSERT INTO invoices (id, number, customer, amount) VALUES (1, 'A', 'b', 1)")
    conn.execute("ALTER TABLE payments RENAME method TO channel")
    conn.execute("ALTER TABLE payments ADD COLUMN note text DEFAULT 'n'")
    conn.execute("ALTER TABLE payments ALTER COLUMN amount TYPE numeric(14, 4)")
    conn.execute("INSERT INTO payments (invoice_id, amount, card_token) VALUES (1, 5, 'tok')")
    [row] = outbox(conn)
    assert row["row_data"]["channel"] == "card" and row["row_data"]["note"] == "n"
    assert "method" not in row["row_data"] and "card_token" not in row["row_data"]
    assert "tok" not in str(row)


def test_columns_is_an_allow_list(conn: psycopg.Connection) -> None:
    conn.execute("SELECT webhooks.attach('payments', resource => 'payments', noun => 'payment',"
                 " parent_resource => 'invoices', parent_column => 'invoice_id', "
                 " columns => ARRAY['id', 'amount'])")
    conn.execute("ALTER TABLE payments ADD COLUMN added_later text DEFAULT 'secret'")
    subscribe_to(conn, "invoices", ["payment.create"])
    conn.execute("INSERT INTO invoices (id, number, customer, amount) VALUES (1, 'A', 'b', 1)")
    conn.execute("INSERT INTO payments (invoice_id, amount, card_token) VALUES (1, 5, 'tok')")
    [row] = outbox(conn)
    assert row["row_data"] == {"id": row["resource_id"], "amount": 5}
    assert row["parent_id"] == 1
    with pytest.raises(psycopg.errors.UndefinedColumn):
        conn.execute("ALTER TABLE payments RENAME amount TO total")


def test_dropping_an_attached_table_detaches_it(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE public.gone (id int PRIMARY KEY)")
    conn.execute("SELECT webhooks.attach('public.gone', resource => 'gone', noun => 'gone')")
    function = conn.execute("SELECT 'capture_' || id FROM webhooks.attachments "
                            "WHERE resource = 'gone'").fetchone()
    assert function is not None
    conn.execute("DROP TABLE public.gone")
    assert conn.execute("SELECT count(*) FROM webhooks.attachments WHERE resource = 'gone'"
                        ).fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname = %s",
                        (function[0],)).fetchone() == (0,)


# -- search_path --------------------------------------------------------------------------

async def test_objects_planted_on_the_search_path_never_reach_the_services_sql(
        conn: psycopg.Connection, pool: AsyncConnectionPool, role: str) -> None:
    # A better match for an untyped literal than pg_catalog's nextval(regclass).
    conn.execute("CREATE FUNCTION public.nextval(text) RETURNS bigint LANGUAGE sql "
                 "AS $f$ SELECT 1::bigint $f$")
    as_role(conn, role, """
        CREATE FUNCTION mallory.quote_ident(text) RETURNS text LANGUAGE sql
            AS $f$ SELECT 'forged' $f$;
        CREATE FUNCTION mallory.hashtext(text) RETURNS integer LANGUAGE sql
            AS $f$ SELECT 0 $f$;
    """)
    with conn.transaction():
        conn.execute("SET LOCAL search_path = mallory, pg_catalog, public")
        conn.execute("SELECT webhooks.attach('public.invoices', resource => 'invoices', "
                     "noun => 'invoice', tenant_column => 'company_id')")
    subscribe_to(conn, "invoices", ["invoice.create"])
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('a', 'b', 1), "
                 "('c', 'd', 2)")
    async with pool.connection() as service:
        path = await (await service.execute("SHOW search_path")).fetchone()
    assert path == ("pg_catalog",)
    await drain_outbox(Store(pool), 10)
    ids = [r[0] for r in conn.execute("SELECT id FROM webhooks.events ORDER BY id").fetchall()]
    assert len(ids) == 2 and len(set(ids)) == 2


async def test_a_poison_row_is_set_aside_whether_or_not_a_subscription_takes_it_in(
        conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    # Fan-out parses each change's row into JSONB once, for every subscription's filter to
    # read: a poison row is set aside whether a subscription's tenant, filter or none
    # takes it in, and the rows around it are delivered.
    conn.execute("CREATE TABLE public.tdocs (id int PRIMARY KEY, tenant text, body json)")
    conn.execute("SELECT webhooks.attach('public.tdocs', resource => 'tdocs', noun => 'tdoc', "
                 "tenant_column => 'tenant')")
    plain = subscribe_to(conn, "tdocs", ["tdoc.create"], tenant="a")
    filtered = subscribe_to(conn, "tdocs", ["tdoc.create"], tenant="c")
    conn.execute("UPDATE webhooks.subscriptions SET filter = '{\"id\": 7}', "
                 "filter_path = %s::jsonpath WHERE id = %s",
                 (compile_path({"id": 7}), filtered))
    poison = r'{"a": "\u0000"}'
    conn.execute("INSERT INTO public.tdocs VALUES (1, 'b', %s), (2, 'a', '{}')", (poison,))
    drained = await drain_outbox(Store(pool), 100)
    assert (drained.rejected, drained.created) == (1, 1)
    assert len(deliveries(conn, plain)) == 1
    conn.execute("INSERT INTO public.tdocs VALUES (3, 'a', %s), (4, 'c', %s), (7, 'c', '{}')",
                 (poison, poison))
    drained = await drain_outbox(Store(pool), 100)
    assert (drained.rejected, drained.created) == (2, 1)
    assert len(deliveries(conn, filtered)) == 1
    texts = [r[0].replace(" ", "") for r in conn.execute(
        "SELECT row_text FROM webhooks.rejected_changes ORDER BY id").fetchall()]
    assert len(texts) == 3
    assert all(f'"id":{n},' in text for n, text in zip((1, 3, 4), texts, strict=True)), texts
    assert conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone() == (0,)
