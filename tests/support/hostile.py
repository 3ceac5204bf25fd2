"""Hostile defaults for the service as a guest in someone else's database: what its owner
may set for everyone (HOSTILE, make_hostile, the fixture `hostile`) and what an
application's session may say for itself (WRITER, writer). A test module takes the fixture
by importing `hostile_defaults`, named apart from it so that a test's argument `hostile`
does not shadow the import."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg
import pytest

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


@pytest.fixture(name="hostile", params=["database", "role"])
def hostile_defaults(request: pytest.FixtureRequest, db_url: str, conn: psycopg.Connection) -> str:
    """The test's database (migrated, with the invoices example) with HOSTILE defaults,
    set for the database or for the service's role in it."""
    return make_hostile(conn, db_url, request.param)


def writer(url: str) -> psycopg.Connection:
    """An application's session: its own formats, but one that may write."""
    return psycopg.connect(url, autocommit=True, client_encoding="UTF8", options=(
        WRITER + " -c default_transaction_read_only=off -c statement_timeout=0"
        " -c lock_timeout=0 -c search_path=public"))
