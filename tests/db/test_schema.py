"""Migrations: the schema they build is exactly the one sql/ describes; they are idempotent
and safe to run from two processes at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import psycopg

from service import db


def dump_schema(url: str) -> str:
    pg_dump = shutil.which("pg_dump") or "pg_dump"
    # The queue tables' daily partitions depend on the day; tests/db/test_partitions.py
    # checks them.
    result = subprocess.run([pg_dump, "--schema-only", "--no-owner", "--schema=webhooks",
                             "--exclude-table=webhooks.*_p2*", url],
                            capture_output=True, text=True, check=True)
    lines = [line for line in result.stdout.splitlines()
             if line and not line.startswith("--") and not line.startswith("SET ")
             and not line.startswith("SELECT pg_catalog.set_config")
             and not line.startswith("\\restrict") and not line.startswith("\\unrestrict")]
    return "\n".join(lines)


def test_migrations_build_exactly_the_schema_in_sql(db_url: str, empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(db.SQL_DIR.joinpath("schema.sql").read_bytes())
        conn.execute(db.SQL_DIR.joinpath("triggers", "capture.sql").read_bytes())
        conn.execute(db.SQL_DIR.joinpath("fanout.sql").read_bytes())
        conn.execute(db.SQL_DIR.joinpath("recovery.sql").read_bytes())
        conn.execute(db.SQL_DIR.joinpath("lifecycle.sql").read_bytes())
        conn.execute(db.SQL_DIR.joinpath("partitions.sql").read_bytes())
        conn.execute(db.SQL_DIR.joinpath("backfill.sql").read_bytes())
        # The attached tables' generated capture functions live in the webhooks schema.
        conn.execute(db.SQL_DIR.joinpath("triggers", "example_invoices.sql").read_bytes())
    # db_url is a clone of the migrated template, with the example attached.
    assert dump_schema(empty_db) == dump_schema(db_url)


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
                              " AND NOT c.relispartition").fetchone()
    assert tables == (15,)


def test_query_files_parse() -> None:
    names = db.queries()
    assert "token_lookup" in names
    assert all(body.strip() for body in names.values())


def test_queries_are_sent_without_comments_and_short_enough_to_be_cached() -> None:
    """psycopg caches the parsing of a query's placeholders only up to 4 KB: every named
    query stays under it once its comments are gone; a `--` inside a literal stays."""
    from service.db import compact, queries

    assert compact("SELECT 1 -- one\n  -- a line of its own\n  FROM t") == "SELECT 1\nFROM t"
    assert compact("SELECT '--not a comment' AS x -- but this is") == \
        "SELECT '--not a comment' AS x"
    assert all(len(q.encode()) <= 4096 for q in queries().values())
    assert not [name for name, q in queries().items() if "\n--" in q or q.startswith("--")]
