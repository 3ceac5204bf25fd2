"""Migrations: numbered migrations never change once on main and hold only deltas; the
replaceable SQL is applied again by every `migrate`; a fresh install is exactly the
committed schema dump; migrating is idempotent, safe from two processes at once, and
refused on a database that a newer version migrated."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from service import db
from tests.support.schema import committed_dump, dump_schema, pg_dump_major

MIGRATIONS = sorted(p.stem for p in db.MIGRATIONS_DIR.glob("*.sql"))


def test_migrate_twice_is_a_no_op(empty_db: str) -> None:
    assert db.migrate(empty_db) == MIGRATIONS
    assert db.migrate(empty_db) == []


def test_two_processes_migrating_at_once(empty_db: str) -> None:
    env = {**os.environ, "DATABASE_URL": empty_db}

    def run(_: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "service", "migrate"], env=env,
                              capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, range(2)))
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    outputs = sorted(r.stdout.strip() for r in results)
    assert outputs == [f"applied {len(MIGRATIONS)} migration(s): {', '.join(MIGRATIONS)}",
                       "database is up to date"]
    with psycopg.connect(empty_db) as conn:
        # Tables, partitioned or not; the partitions of the queue tables are not counted.
        tables = conn.execute("SELECT count(*) FROM pg_class c"
                              " JOIN pg_namespace n ON n.oid = c.relnamespace"
                              " WHERE n.nspname = 'webhooks' AND c.relkind IN ('r', 'p')"
                                  # yoyo's four (service.db.prepare_yoyo) aside.
                                  " AND c.relname !~ '^_?yoyo_'"
                              " AND NOT c.relispartition").fetchone()
    assert tables == (17,)


def test_query_files_parse() -> None:
    names = db.queries()
    assert "token_lookup" in names
    assert all(body.strip() for body in names.values())


def test_queries_are_sent_without_comments_and_short_enough_to_be_cached() -> None:
    """psycopg caches the parsing of a query's placeholders only up to 4 KB: every named
    query stays under it once its comments are gone; a `--` inside a literal stays.
    The fan-out (it leases a quiet queue's deliveries) and the claim (it also takes from
    the lane's queues) are longer: only the worker runs them, and it sends them with
    PostgreSQL's placeholders (service.db.raw_query), which psycopg does not parse."""
    from service.db import compact, queries

    assert compact("SELECT 1 -- one\n  -- a line of its own\n  FROM t") == "SELECT 1\nFROM t"
    assert compact("SELECT '--not a comment' AS x -- but this is") == \
        "SELECT '--not a comment' AS x"
    sizes = {name: len(q.encode()) for name, q in queries().items()}
    assert sizes.pop("fanout") <= 8192
    assert sizes.pop("claim") <= 8192
    assert all(size <= 4096 for size in sizes.values()), sizes
    assert not [name for name, q in queries().items() if "\n--" in q or q.startswith("--")]


# Migrations written before replaceable SQL existed: they copy whole sql/ files, frozen now.
BEFORE_REPLACEABLE = "0007.backfill"


def test_a_fresh_install_is_the_committed_dump(empty_db: str) -> None:
    db.migrate(empty_db)
    major, committed = committed_dump()
    if major != pg_dump_major():
        pytest.skip(f"tests/schema.dump.sql was made with pg_dump {major}, this is "
                    f"pg_dump {pg_dump_major()}: tests/e2e/test_upgrade.py still compares "
                    "upgraded databases with a fresh install")
    assert dump_schema(empty_db) == committed, \
        "the schema changed: run `make schema-dump` and commit tests/schema.dump.sql"


def test_migrations_never_change_once_listed() -> None:
    """migrations/SHA256SUMS lists every migration with its checksum: a database that
    applied one never sees a later edit of it (yoyo records ids), so none is ever edited.
    A new migration is added to the list when it is written."""
    listed = {}
    for line in (db.MIGRATIONS_DIR / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        listed[name] = digest
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in db.MIGRATIONS_DIR.glob("*.sql")}
    assert sorted(files) == sorted(listed), "every migration is listed in migrations/SHA256SUMS"
    changed = [name for name, digest in files.items() if listed[name] != digest]
    assert not changed, f"migrations changed after they were written: {changed}"


# What only the replaceable SQL defines; a migration may DROP such an object (a changed
# signature), never create one.
DEFINES_REPLACEABLE = re.compile(
    r"^\s*CREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE|VIEW|TRIGGER|EVENT\s+TRIGGER)\b",
    re.IGNORECASE | re.MULTILINE)
# What only the numbered migrations hold.
DEFINES_TABLES = re.compile(
    r"^\s*(CREATE\s+(UNLOGGED\s+)?(TABLE|INDEX|UNIQUE\s+INDEX|SEQUENCE|TYPE|DOMAIN|SCHEMA)"
    r"|ALTER\s+(TABLE|INDEX|SEQUENCE|TYPE)|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM"
    r"|DROP\s+(TABLE|FUNCTION|VIEW))\b", re.IGNORECASE | re.MULTILINE)


def test_new_migrations_hold_only_deltas() -> None:
    for path in sorted(db.MIGRATIONS_DIR.glob("*.sql")):
        if path.stem > BEFORE_REPLACEABLE:
            found = DEFINES_REPLACEABLE.search(path.read_text())
            assert found is None, f"{path.name} defines {found.group(0).strip()!r}: " \
                "functions, triggers and views live in the replaceable SQL files"


def top_level(sql: str) -> str:
    """`sql` without its dollar-quoted bodies and comments: the statements a file runs."""
    sql = re.sub(r"(\$[A-Za-z_]*\$).*?\1", "", sql, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", "", sql)


def test_replaceable_sql_is_listed_and_holds_no_tables() -> None:
    listed = db.replaceable_files()
    assert all(path.is_file() for path in listed)
    kept_apart = {"example_invoices.sql"}
    on_disk = {p for p in db.SQL_DIR.rglob("*.sql")
               if p.parent.name != "queries" and p.name not in kept_apart}
    assert on_disk == set(listed), "sql/replaceable.txt lists every replaceable file"
    for path in listed:
        found = DEFINES_TABLES.search(top_level(path.read_text()))
        assert found is None, f"{path.name} runs {found.group(0).strip()!r}: tables, " \
            "indexes, data and DROPs belong in a numbered migration"


def test_migrate_applies_the_replaceable_sql_and_the_capture_functions_again(
        db_url: str) -> None:
    """A database whose functions and capture functions are not today's (an earlier
    version's, or someone's edit) gets today's back from `migrate`, with no migration."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        def definitions() -> list[str]:
            return [r[0] for r in conn.execute(
                "SELECT pg_get_functiondef(p.oid) FROM pg_proc p"
                " WHERE p.pronamespace = 'webhooks'::regnamespace"
                "   AND p.proname IN ('subscription_json', 'capture_1', 'on_drop')"
                " ORDER BY p.proname").fetchall()]

        today = definitions()
        conn.execute("CREATE OR REPLACE FUNCTION webhooks.subscription_json("
                     "s webhooks.subscriptions) RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$")
        conn.execute("CREATE OR REPLACE FUNCTION webhooks.capture_1() RETURNS trigger"
                     " LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$")
        conn.execute("CREATE OR REPLACE FUNCTION webhooks.on_drop() RETURNS event_trigger"
                     " LANGUAGE plpgsql AS $$ BEGIN END $$")
        assert definitions() != today
        assert db.migrate(db_url) == []
        assert definitions() == today


def test_a_database_migrated_by_a_newer_version_is_refused(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO webhooks._yoyo_migration (migration_hash, migration_id,"
                     " applied_at_utc) VALUES ('f00d', '0099.from-the-future', now())")
        conn.execute("CREATE OR REPLACE FUNCTION webhooks.subscription_json("
                     "s webhooks.subscriptions) RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$")
    result = subprocess.run([sys.executable, "-m", "service", "migrate"],
                            env={**os.environ, "DATABASE_URL": db_url},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "migrated by a newer version of the service" in result.stderr
    assert "0099.from-the-future" in result.stderr
    assert "Traceback" not in result.stderr
    with psycopg.connect(db_url, autocommit=True) as conn:
        # Nothing was applied, not even the replaceable SQL.
        row = conn.execute("SELECT webhooks.subscription_json(NULL::webhooks.subscriptions)"
                           ).fetchone()
    assert row == ("x",)
