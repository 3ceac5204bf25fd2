"""Shared fixtures: a migrated template database per test session, a fresh clone per test;
a receiver and a running API (helpers in tests/support/).

DATABASE_URL names the server (`make test` sets it); each session creates its own
databases there and drops them at the end.

Every test gets the layer marker of its folder (`pytest -m unit` runs without a database):
tests/unit uses no database; tests/db needs PostgreSQL but starts no worker, API or
receiver; tests/e2e runs a worker, an API or a receiver.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from pytest_postgresql.janitor import DatabaseJanitor

from service import db
from tests.support.api import Api, api_for
from tests.support.browser import browser  # noqa: F401  (a fixture for the browser tests)
from tests.support.receivers import Receiver
from tests.support.worker import open_pool

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


class Templates:
    """Migrated template databases, one per UTC day the session runs on: a fresh install
    holds the queue partitions of its own day and the two after it, so a session that
    crosses midnight UTC clones a template made on the new day."""

    def __init__(self) -> None:
        self._made: dict[datetime.date, DatabaseJanitor] = {}

    def current(self) -> str:
        today = datetime.datetime.now(datetime.UTC).date()
        if today not in self._made:
            name = f"webhooks_tpl_{uuid.uuid4().hex[:10]}"
            janitor = _janitor(name)
            janitor.init()
            self._made[today] = janitor
            url = with_dbname(SERVER_URL, name)
            db.migrate(url)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    db.SQL_DIR.joinpath("triggers", "example_invoices.sql").read_bytes())
        return str(self._made[today].dbname)

    def drop(self) -> None:
        for janitor in self._made.values():
            janitor.drop()


@pytest.fixture(scope="session")
def template_db() -> Iterator[Templates]:
    """The session's migrated templates, cloned by `db_url`."""
    templates = Templates()
    try:
        yield templates
    finally:
        templates.drop()


@contextlib.contextmanager
def new_database(prefix: str = "webhooks_empty") -> Iterator[str]:
    """URL of a new, empty database (not migrated), dropped at the end of the block."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    janitor = _janitor(name)
    janitor.init()
    try:
        yield with_dbname(SERVER_URL, name)
    finally:
        janitor.drop()


@pytest.fixture
def empty_db() -> Iterator[str]:
    """URL of a new, empty database (not migrated) for one test."""
    with new_database() as url:
        yield url


@pytest.fixture
def db_url(template_db: Templates) -> Iterator[str]:
    """URL of a fresh database for one test: migrated, with the invoices/payments example."""
    name = f"webhooks_t_{uuid.uuid4().hex[:10]}"
    janitor = _janitor(name, template=template_db.current())
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


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    """A connection pool on the test's database with the service's session settings (a
    test module that wants another size defines its own `pool`)."""
    async with open_pool(db_url) as p:
        yield p


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A running receiver that answers 200 and echoes the handshake secret."""
    async with Receiver() as running:
        yield running


@pytest.fixture
async def api(request: pytest.FixtureRequest, db_url: str) -> AsyncIterator[Api]:
    """The API serving the test's database, with a token for "alice" and a receiver;
    settings from the closest `api_settings(**settings)` marker."""
    marker = request.node.get_closest_marker("api_settings")
    async with api_for(db_url, **(marker.kwargs if marker else {})) as running:
        yield running


# -- layers ---------------------------------------------------------------------------

LAYERS = ("unit", "db", "e2e")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test with its folder's layer; a test outside them is an error."""
    for item in items:
        folder = item.path.resolve().relative_to(TESTS).parts[0]
        if folder not in LAYERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in tests/unit, tests/db or "
                                    "tests/e2e, by the layer they need")
        item.add_marker(folder)
