"""Shared fixtures: a migrated template database per test session, a fresh clone per test;
a receiver and a running API (helpers in tests/support/).

DATABASE_URL names the server (`make test` sets it); each session creates its own
databases there and drops them at the end.

Every test gets one layer marker (`pytest -m unit` runs without a database):
`unit` uses no database fixture; `e2e` starts a worker, an API or a receiver; `db` the rest.
"""

from __future__ import annotations

import inspect
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from pytest_postgresql.janitor import DatabaseJanitor

from service import db
from tests.support.api import Api, api_for
from tests.support.receivers import Receiver

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
def empty_db() -> Iterator[str]:
    """URL of a new, empty database (not migrated) for one test."""
    name = f"webhooks_empty_{uuid.uuid4().hex[:10]}"
    janitor = _janitor(name)
    janitor.init()
    try:
        yield with_dbname(SERVER_URL, name)
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

# Fixtures that need the database, and fixtures or helpers that run a worker, an API or a
# receiver (named in the test's own source when it starts one itself).
DB_FIXTURES = {"template_db", "db_url", "conn", "empty_db", "new_db"}
DB_HELPERS = ("SERVER_URL", "psycopg.connect")
E2E_FIXTURES = {"api", "receiver"}
E2E_HELPERS = ("running_worker", "open_worker", "worker_env", "Receiver(", "hanging_receiver(",
               "RawTarget(", "api_for(", "serving(", "background_api(", "Popen(", "tests.chaos")


def layer(item: pytest.Item) -> str:
    """`unit`, `db` or `e2e` for one collected test."""
    names = set(getattr(item, "fixturenames", ()))
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        source = ""
    if names & E2E_FIXTURES or any(helper in source for helper in E2E_HELPERS):
        return "e2e"
    if names & DB_FIXTURES or any(helper in source for helper in DB_HELPERS):
        return "db"
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test with its layer unless the test names one itself."""
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("unit", "db", "e2e")):
            item.add_marker(layer(item))
