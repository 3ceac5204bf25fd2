"""Shared fixtures: a migrated template database per test session, a fresh clone per test.

DATABASE_URL names the server (`make test` sets it); each session creates its own
databases there and drops them at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from pytest_postgresql.janitor import DatabaseJanitor

from service import db

SERVER_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def with_dbname(url: str, dbname: str) -> str:
    """The same server URL, pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


def _janitor(dbname: str, template: str | None = None, as_template: bool = False
             ) -> DatabaseJanitor:
    parts = urlsplit(SERVER_URL)
    return DatabaseJanitor(
        user=parts.username or "postgres",
        password=parts.password,
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        dbname=dbname,
        template_dbname=template,
        as_template=as_template,
        maintenance_dbname=(parts.path.lstrip("/") or "postgres"),
    )


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    """Name of a database migrated once per session, cloned by `db_url`."""
    name = f"webhooks_tpl_{uuid.uuid4().hex[:10]}"
    janitor = _janitor(name)
    janitor.init()
    try:
        url = with_dbname(SERVER_URL, name)
        db.migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(db.SQL_DIR.joinpath("triggers", "example_invoices.sql").read_bytes())
        yield name
    finally:
        janitor.drop()


@pytest.fixture
def db_url(template_db: str) -> Iterator[str]:
    """URL of a fresh database for one test: migrated, with the invoices/payments example."""
    name = f"webhooks_t_{uuid.uuid4().hex[:10]}"
    janitor = _janitor(name, template=template_db)
    janitor.init()
    try:
        yield with_dbname(SERVER_URL, name)
    finally:
        janitor.drop()


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection
