"""Updates pair each new row with its own old row by the table's primary key, or a unique
index, that holds the id column: rows of different tenants sharing an id are never paired
with each other, one statement updating N rows makes at most N events, and `attach`
refuses a table without such a key (as a table whose id has a type without an ordering,
json, always is)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.db.test_capture import outbox
from tests.support.subscriptions import subscribe_to


def updates(conn: psycopg.Connection, resource: str = "items") -> list[dict[str, Any]]:
    return [r for r in outbox(conn) if r["resource"] == resource and r["name"].endswith(".update")]


def key_columns(conn: psycopg.Connection, table: str) -> list[str] | None:
    row = conn.execute("SELECT key_columns FROM webhooks.attachments "
                       "WHERE table_oid = %s::regclass", (table,)).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def items(conn: psycopg.Connection) -> psycopg.Connection:
    """public.items keyed by (tenant_id, id), attached on `id` with previous rows."""
    conn.execute("CREATE TABLE public.items (tenant_id text, id int, name text, "
                 "PRIMARY KEY (tenant_id, id))")
    conn.execute("SELECT webhooks.attach('public.items', 'items', 'item', id_column => 'id', "
                 "tenant_column => 'tenant_id', include_previous => true)")
    subscribe_to(conn, "items", ["item.update"])
    return conn


def test_rows_of_three_tenants_sharing_an_id_each_get_their_own_previous(
        items: psycopg.Connection) -> None:
    conn = items
    conn.execute("INSERT INTO public.items VALUES ('a', 1, 'ann'), ('b', 1, 'bob'), "
                 "('c', 1, 'cy')")
    conn.execute("UPDATE public.items SET name = upper(name)")
    got = sorted((u["tenant"], u["row_data"]["name"], u["previous"]) for u in updates(conn))
    assert got == [("a", "ANN", {"tenant_id": "a", "id": 1, "name": "ann"}),
                   ("b", "BOB", {"tenant_id": "b", "id": 1, "name": "bob"}),
                   ("c", "CY", {"tenant_id": "c", "id": 1, "name": "cy"})]
    assert all(u["changed"] == ["name"] for u in updates(conn))
    assert key_columns(conn, "public.items") == ["tenant_id", "id"]


def test_a_thousand_rows_sharing_an_id_make_a_thousand_events(
        items: psycopg.Connection) -> None:
    conn = items
    conn.execute("INSERT INTO public.items SELECT 't' || i, 1, 'n' || i "
                 "FROM generate_series(1, 1000) i")
    conn.execute("UPDATE public.items SET name = upper(name)")
    got = updates(conn)
    assert len(got) == 1000
    assert all(u["previous"]["tenant_id"] == u["tenant"]
               and u["previous"]["name"].upper() == u["row_data"]["name"] for u in got)


def test_a_row_whose_key_changed_has_no_previous(items: psycopg.Connection) -> None:
    conn = items
    conn.execute("INSERT INTO public.items VALUES ('a', 1, 'ann'), ('b', 1, 'bob')")
    conn.execute("UPDATE public.items SET tenant_id = 'z' WHERE tenant_id = 'a'")
    [moved] = updates(conn)
    assert moved["tenant"] == "z" and moved["previous"] is None
    assert moved["changed"] == ["tenant_id", "id", "name"]


@pytest.mark.parametrize("table", [
    "CREATE TABLE public.loose (id int, name text)",
    "CREATE TABLE public.loose (id int, name text, other int PRIMARY KEY)",
    "CREATE TABLE public.loose (id int, name text); "
    "CREATE UNIQUE INDEX ON public.loose (id) WHERE name IS NOT NULL",
    "CREATE TABLE public.loose (id int, name text); CREATE UNIQUE INDEX ON public.loose ((id + 0))",
    "CREATE TABLE public.loose (id int PRIMARY KEY DEFERRABLE, name text)",
], ids=["no key", "key without the id", "partial", "expression", "deferrable"])
def test_a_table_without_a_key_holding_the_id_is_refused(conn: psycopg.Connection,
                                                         table: str) -> None:
    conn.execute(table)
    before = conn.execute("SELECT count(*) FROM webhooks.attachments").fetchone()
    with pytest.raises(psycopg.errors.InvalidTableDefinition) as raised:
        conn.execute("SELECT webhooks.attach('public.loose', 'loose', 'loose')")
    message = raised.value.diag.message_primary or ""
    assert "loose" in message and "primary key or unique index" in message
    assert "id column id" in message
    assert conn.execute("SELECT count(*) FROM webhooks.attachments").fetchone() == before
    assert conn.execute("SELECT count(*) FROM webhooks.hook_events WHERE resource = 'loose'"
                        ).fetchone() == (0,)


def test_an_id_type_without_an_ordering_is_refused(conn: psycopg.Connection) -> None:
    # No key can hold a json id, so attach refuses the table before a backfill could.
    conn.execute("CREATE TABLE public.docs (id json, body text)")
    with pytest.raises(psycopg.errors.InvalidTableDefinition, match="no primary key"):
        conn.execute("SELECT webhooks.attach('public.docs', resource => 'docs', noun => 'doc')")


def test_a_unique_index_holding_the_id_is_the_key(conn: psycopg.Connection) -> None:
    # No primary key holds the id: of the unique indexes that do, the one with the fewest
    # columns pairs.
    conn.execute("""
        CREATE TABLE public.docs (uid uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                                  tenant text NOT NULL, id int NOT NULL, title text,
                                  version int NOT NULL DEFAULT 1);
        CREATE UNIQUE INDEX docs_wide ON public.docs (id, tenant, version);
        CREATE UNIQUE INDEX docs_key ON public.docs (tenant, id) INCLUDE (title);
        CREATE UNIQUE INDEX docs_partial ON public.docs (id) WHERE tenant = 'a';
    """)
    conn.execute("SELECT webhooks.attach('public.docs', 'docs', 'doc', tenant_column => 'tenant', "
                 "include_previous => true)")
    assert key_columns(conn, "public.docs") == ["tenant", "id"]
    subscribe_to(conn, "docs", ["doc.update"])
    conn.execute("INSERT INTO public.docs (tenant, id, title) VALUES ('a', 1, 'x'), ('b', 1, 'y')")
    conn.execute("UPDATE public.docs SET title = title || '!'")
    got = sorted((u["tenant"], u["row_data"]["title"], u["previous"]["title"])
                 for u in updates(conn, "docs"))
    assert got == [("a", "x!", "x"), ("b", "y!", "y")]


def test_dropping_the_key_of_an_attached_table_is_refused(items: psycopg.Connection) -> None:
    conn = items
    with pytest.raises(psycopg.errors.InvalidTableDefinition) as raised:
        conn.execute("ALTER TABLE public.items DROP CONSTRAINT items_pkey")
    assert "webhooks.detach" in (raised.value.diag.message_hint or "")
    # Another key that holds the id may take its place, in one statement.
    conn.execute("ALTER TABLE public.items DROP CONSTRAINT items_pkey, "
                 "ADD PRIMARY KEY (id, tenant_id)")
    assert key_columns(conn, "public.items") == ["id", "tenant_id"]
    conn.execute("INSERT INTO public.items VALUES ('a', 1, 'ann'), ('b', 1, 'bob')")
    conn.execute("UPDATE public.items SET name = upper(name)")
    assert sorted((u["tenant"], u["previous"]["name"]) for u in updates(conn)) == [
        ("a", "ann"), ("b", "bob")]


def test_an_attachment_made_without_a_key_still_pairs_on_the_id(
        items: psycopg.Connection) -> None:
    # As an earlier version left it: no key recorded, and the table has none.
    conn = items
    conn.execute("UPDATE webhooks.attachments SET key_columns = NULL, key_index = NULL")
    conn.execute("ALTER TABLE public.items DROP CONSTRAINT items_pkey")
    assert key_columns(conn, "public.items") is None
    conn.execute("INSERT INTO public.items VALUES ('a', 1, 'ann'), ('b', 2, 'bob')")
    conn.execute("UPDATE public.items SET name = upper(name)")
    assert sorted((u["tenant"], u["previous"]["name"]) for u in updates(conn)) == [
        ("a", "ann"), ("b", "bob")]
    # A key added later is taken up.
    conn.execute("ALTER TABLE public.items ADD PRIMARY KEY (tenant_id, id)")
    assert key_columns(conn, "public.items") == ["tenant_id", "id"]
