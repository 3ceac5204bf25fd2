"""migrate in a database other roles share: yoyo's records live in schema webhooks, never
where the database's or a role's search_path points. An application role that owns a
schema early in that path cannot plant yoyo's tables there (a trigger the migrating
superuser would run, records that skip pending migrations), a schema webhooks another role
made first is refused, and a database migrated by an earlier version (yoyo's tables in
public) has its records moved in, not applied again. Under the defaults a database's
owner may set for everyone (tests/support/hostile.py), migrate installs everything as
written and finds its records again (the API, the worker and `status` under the same
defaults: tests/e2e/test_guest_settings.py)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from service import db
from tests.db.test_guest_ddl import create_role, drop_role
from tests.support.hostile import make_hostile

YOYO = ("_yoyo_migration", "_yoyo_log", "_yoyo_version", "yoyo_lock")


@pytest.fixture
def squatter(empty_db: str) -> Iterator[str]:
    """An ordinary role that owns schema `evil`, first in the database's search_path, and
    may create schemas (as a database's owner may)."""
    with psycopg.connect(empty_db, autocommit=True) as conn:
        name = create_role(conn, "squat")
        conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(conn.info.dbname), sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE SCHEMA evil AUTHORIZATION {}").format(
            sql.Identifier(name)))
        conn.execute(sql.SQL("ALTER DATABASE {} SET search_path = evil, public").format(
            sql.Identifier(conn.info.dbname)))
    try:
        yield name
    finally:
        drop_role(empty_db, name)


def tables_of(conn: psycopg.Connection, name: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relname = %s ORDER BY 1", (name,)).fetchall()]


def test_planted_yoyo_tables_are_never_read_nor_their_triggers_run(
        empty_db: str, squatter: str) -> None:
    known = sorted(p.name.removesuffix(".sql") for p in db.MIGRATIONS_DIR.glob("*.sql"))
    with psycopg.connect(empty_db, user=squatter, autocommit=True) as app:
        # Records that say every migration ran, and a lock table whose trigger copies the
        # tokens out when yoyo takes its lock.
        app.execute("CREATE TABLE evil._yoyo_migration (migration_hash varchar(64) PRIMARY"
                    " KEY, migration_id varchar(255), applied_at_utc timestamp)")
        app.execute("CREATE TABLE evil._yoyo_version (version int PRIMARY KEY,"
                    " installed_at_utc timestamp)")
        app.execute("INSERT INTO evil._yoyo_version VALUES (2, now())")
        app.execute("CREATE TABLE evil._yoyo_log (id varchar(36) PRIMARY KEY, migration_hash"
                    " varchar(64), migration_id varchar(255), operation varchar(10),"
                    " username varchar(255), hostname varchar(255), comment varchar(255),"
                    " created_at_utc timestamp)")
        for mid in known:
            app.execute("INSERT INTO evil._yoyo_migration VALUES"
                        " (encode(sha256(convert_to(%s, 'UTF8')), 'hex'), %s, now())",
                        (mid, mid))
        app.execute("CREATE TABLE evil.yoyo_lock (locked int DEFAULT 1 PRIMARY KEY,"
                    " ctime timestamp, pid int NOT NULL)")
        app.execute("CREATE TABLE evil.pwned (who text, super boolean)")
        app.execute("GRANT INSERT ON evil.pwned TO PUBLIC")
        app.execute("CREATE FUNCTION evil.grab() RETURNS trigger LANGUAGE plpgsql AS $$"
                    " BEGIN INSERT INTO evil.pwned SELECT current_user, rolsuper FROM pg_roles"
                    " WHERE rolname = current_user; RETURN NEW; END $$")
        app.execute("CREATE TRIGGER grab BEFORE INSERT ON evil.yoyo_lock"
                    " FOR EACH ROW EXECUTE FUNCTION evil.grab()")

    applied = db.migrate(empty_db)

    assert applied == known  # every migration ran: the planted records were not read
    assert db.migrate(empty_db) == []
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM evil.pwned").fetchone() == (0,)
        for table in YOYO:
            assert tables_of(conn, table) == ["evil", "webhooks"], table
        assert conn.execute("SELECT count(*) FROM webhooks._yoyo_migration").fetchone() == (
            len(known),)
        assert conn.execute("SELECT to_regclass('webhooks.subscriptions')").fetchone() != (
            None,)


def test_a_schema_webhooks_another_role_made_is_refused(empty_db: str,
                                                        squatter: str) -> None:
    with psycopg.connect(empty_db, user=squatter, autocommit=True) as app:
        app.execute("CREATE SCHEMA webhooks")
    with pytest.raises(db.MigrationRefused, match=f"belongs to role {squatter}"):
        db.migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relnamespace ="
                            " 'webhooks'::regnamespace").fetchone() == (0,)


def test_an_earlier_versions_records_in_public_are_moved_not_applied_again(
        empty_db: str, squatter: str) -> None:
    assert db.migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        # Where versions before this one kept them (the first schema of the search path).
        for table in YOYO:
            conn.execute(sql.SQL("ALTER TABLE webhooks.{} SET SCHEMA public").format(
                sql.Identifier(table)))
        before = conn.execute("SELECT migration_id FROM public._yoyo_migration"
                              " ORDER BY 1").fetchall()
    # A copy the application role made, with more rows, is not the one taken.
    with psycopg.connect(empty_db, user=squatter, autocommit=True) as app:
        app.execute("CREATE TABLE evil._yoyo_migration (migration_hash varchar(64) PRIMARY"
                    " KEY, migration_id varchar(255), applied_at_utc timestamp)")
        app.execute("INSERT INTO evil._yoyo_migration SELECT md5(i::text), '00' || i,"
                    " now() FROM generate_series(10, 99) i")

    assert db.migrate(empty_db) == []

    with psycopg.connect(empty_db, autocommit=True) as conn:
        for table in YOYO:
            assert "webhooks" in tables_of(conn, table), table
            assert "public" not in tables_of(conn, table), table
        assert conn.execute("SELECT migration_id FROM webhooks._yoyo_migration"
                            " ORDER BY 1").fetchall() == before
        assert conn.execute("SELECT count(*) FROM evil._yoyo_migration").fetchone() == (90,)


def test_service_tables_without_a_trusted_record_are_refused(empty_db: str,
                                                             squatter: str) -> None:
    assert db.migrate(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute("DROP TABLE webhooks._yoyo_migration")
    with pytest.raises(db.MigrationRefused, match="no record of the migrations applied"):
        db.migrate(empty_db)


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
