"""Shared fixtures: a migrated template database per test run, a fresh clone per test; a
receiver and a running API (helpers in tests/support/).

DATABASE_URL names the server (`make test` sets it); each run creates its own databases
there and drops them at the end. Under pytest-xdist (`make test` runs the suite on several
processes) the processes of one run share its template: the first that needs it migrates
it, the others wait for it and clone it, and the controlling process drops it at the end.

Every test gets the layer marker of its folder (`pytest -m unit` runs without a database):
tests/unit uses no database; tests/db needs PostgreSQL but starts no worker, API or
receiver; tests/e2e runs a worker, an API or a receiver. The tests of SERIAL below are
marked `serial`: `make test` runs them after the others, alone.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql
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


@functools.cache
def _server_version() -> int:
    with psycopg.connect(SERVER_URL, autocommit=True) as conn:
        return conn.info.server_version


class _Janitor(DatabaseJanitor):
    """Clones a template by copying its files (STRATEGY FILE_COPY, PostgreSQL 15+; the
    only way before): PostgreSQL 15's default writes the whole template to the WAL, 0.4 s
    of the server's CPU per clone against 0.14 s, for hundreds of clones a run."""

    def _build_create_database_sql(self) -> sql.Composed:
        query = super()._build_create_database_sql()
        if self.template_dbname and _server_version() >= 150000:
            query = query + sql.SQL(" STRATEGY FILE_COPY")
        return query


def _janitor(dbname: str, template: str | None = None, as_template: bool = False
             ) -> DatabaseJanitor:
    parts = urlsplit(SERVER_URL)
    return _Janitor(
        user=parts.username or "postgres",
        password=parts.password,
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        dbname=dbname,
        template_dbname=template,
        as_template=as_template,
        maintenance_dbname=(parts.path.lstrip("/") or "postgres"),
    )


def _install(url: str) -> None:
    """Migrates the database at `url` and loads the invoices/payments example."""
    db.migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(db.SQL_DIR.joinpath("triggers", "example_invoices.sql").read_bytes())


def _shared_template(name: str) -> None:
    """Makes the migrated template `name` unless another process of the run made it: under
    an advisory lock, so one process migrates it while the others wait; built under another
    name and renamed when complete, so a process that died while migrating leaves no
    half-made template behind that name."""
    janitor = _janitor(name)
    with janitor.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (name,))
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        if cur.fetchone() is not None:
            return
        building = _janitor(f"{name}_new")
        building.drop()
        building.init()
        _install(with_dbname(SERVER_URL, building.dbname))
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s", (building.dbname,))
        cur.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
            sql.Identifier(building.dbname), sql.Identifier(name)))
    # The lock ends with the session of `cur`.


class Dropper:
    """Drops this process's databases in the background. DROP DATABASE waits for a
    checkpoint and for every backend of the server to acknowledge it: seconds when other
    sessions keep the server busy, which a test need not wait for. At most BACKLOG drops
    wait at once (a test's teardown then waits for room); the end of the session waits for
    them all (`close`)."""

    BACKLOG = 48

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._room = threading.BoundedSemaphore(self.BACKLOG)
        self.failures: list[str] = []

    def drop(self, name: str) -> None:
        self._room.acquire()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(8, thread_name_prefix="drop-database")
        self._pool.submit(self._drop, name)

    def _drop(self, name: str) -> None:
        try:
            _janitor(name).drop()
        except Exception as exc:
            self.failures.append(f"{name}: {exc}")
        finally:
            self._room.release()

    def close(self) -> None:
        """Waits for the drops under way; says on stderr which failed."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for failure in self.failures:
            print(f"tests/conftest.py: a test database was not dropped: {failure}",
                  file=sys.stderr)
        self.failures.clear()


_dropper = Dropper()


def drop_database(name: str) -> None:
    """Drops the database `name` in the background (Dropper)."""
    _dropper.drop(name)


class Templates:
    """Migrated template databases, one per UTC day the run goes on: a fresh install holds
    the queue partitions of its own day and the two after it, so a run that crosses
    midnight UTC clones a template made on the new day.

    `run`: the id of a pytest-xdist run, whose processes share its templates (and leave
    dropping them to the controlling process); None: this process makes and drops its own.
    """

    def __init__(self, run: str | None = None) -> None:
        self.run = run
        self._made: dict[datetime.date, str] = {}

    def current(self) -> str:
        today = datetime.datetime.now(datetime.UTC).date()
        if today not in self._made:
            if self.run is None:
                name = f"webhooks_tpl_{uuid.uuid4().hex[:10]}"
                _janitor(name).init()
                _install(with_dbname(SERVER_URL, name))
            else:
                name = f"webhooks_tpl_{self.run[:10]}_{today:%Y%m%d}"
                _shared_template(name)
            self._made[today] = name
        return self._made[today]

    @property
    def names(self) -> list[str]:
        return list(self._made.values())

    def drop(self) -> None:
        for name in self._made.values():
            _dropper.drop(name)


class Clones:
    """The tests' databases of this process, each cloned from the current template one test
    ahead, while the test before runs (CREATE DATABASE takes up to a second on a busy
    server), and dropped behind in the background (Dropper)."""

    def __init__(self, templates: Templates) -> None:
        self.templates = templates
        self._maker = ThreadPoolExecutor(1, thread_name_prefix="clone-database")
        self._ahead: tuple[str, Future[str]] | None = None  # (its template, its name)

    @staticmethod
    def _clone(template: str) -> str:
        name = f"webhooks_t_{uuid.uuid4().hex[:10]}"
        _janitor(name, template=template).init()
        return name

    def _take_ahead(self) -> tuple[str, str] | None:
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        template, future = ahead
        try:
            return template, future.result()
        except Exception:
            return None  # made again in the foreground, where a failure fails the test

    def take(self, ahead: bool = True) -> str:
        """The name of a new clone of the current template; `ahead`: and start the next."""
        template = self.templates.current()
        made = self._take_ahead()
        if made is not None and made[0] != template:  # made from yesterday's
            _dropper.drop(made[1])
            made = None
        name = made[1] if made is not None else self._clone(template)
        if ahead:
            self._ahead = (template, self._maker.submit(self._clone, template))
        return name

    def close(self) -> None:
        ahead = self._take_ahead()
        if ahead is not None:
            _dropper.drop(ahead[1])
        self._maker.shutdown(wait=True)


@pytest.fixture(scope="session")
def template_db(request: pytest.FixtureRequest) -> Iterator[Templates]:
    """The run's migrated templates."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is None:
        templates = Templates()
        try:
            yield templates
        finally:
            templates.drop()
        return
    templates = Templates(run=workerinput["testrunuid"])
    try:
        yield templates
    finally:
        # Sent to the controlling process, which drops them once every process is done.
        request.config.workeroutput[TEMPLATES_KEY] = templates.names


@pytest.fixture(scope="session")
def clones(template_db: Templates) -> Iterator[Clones]:
    """This process's clones of the templates, taken by `db_url`."""
    made = Clones(template_db)
    try:
        yield made
    finally:
        made.close()


TEMPLATES_KEY = "webhooks_templates"
_shared_templates: set[str] = set()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """(pytest-xdist, in the controlling process) A process finished: the templates it used."""
    _shared_templates.update(getattr(node, "workeroutput", {}).get(TEMPLATES_KEY, ()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Waits for this process's drops; in the controlling process of a pytest-xdist run,
    drops the templates its processes shared."""
    while _shared_templates:
        _dropper.drop(_shared_templates.pop())
    _dropper.close()


@contextlib.contextmanager
def new_database(prefix: str = "webhooks_empty") -> Iterator[str]:
    """URL of a new, empty database (not migrated), dropped after the block (in the
    background: Dropper)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    _janitor(name).init()
    try:
        yield with_dbname(SERVER_URL, name)
    finally:
        _dropper.drop(name)


@pytest.fixture
def empty_db() -> Iterator[str]:
    """URL of a new, empty database (not migrated) for one test."""
    with new_database() as url:
        yield url


@pytest.fixture
def db_url(request: pytest.FixtureRequest, clones: Clones) -> Iterator[str]:
    """URL of a fresh database for one test: migrated, with the invoices/payments example.
    A serial test's is neither cloned nor dropped while it runs, nor the next one's: it
    runs alone."""
    alone = request.node.get_closest_marker("serial") is not None
    name = clones.take(ahead=not alone)
    try:
        yield with_dbname(SERVER_URL, name)
    finally:
        if alone:
            _janitor(name).drop()
        else:
            _dropper.drop(name)


# The options of a test's own connections: `jit` off, as on the service's. With it on, a
# test's statement of 100,000 rows spent longer compiling than running, and the worker's
# statements under the queue pool's settings (their disabled plan nodes' costs) compiled at
# every run: 3 s for a 10 ms claim.
TEST_OPTIONS = "-c jit=off"


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test's database (TEST_OPTIONS)."""
    with psycopg.connect(db_url, autocommit=True, options=TEST_OPTIONS) as connection:
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


# -- layers, and what runs beside what ---------------------------------------------------

LAYERS = ("unit", "db", "e2e")
TESTS = Path(__file__).resolve().parent

# Marked `serial`: `make test` runs them after the others, alone, since they measure time
# or throughput that other tests' load on the same cores would change. A test file, or a
# test (a node id's prefix), each with its reason.
SERIAL = {
    # The rate two workers keep to together, and how soon another subscription is served.
    "tests/db/test_rate_limits.py::test_two_workers_together_keep_to_the_rate": "rate",
    # /readyz within a second while the database hangs.
    "tests/e2e/test_not_migrated.py::test_readyz_answers_within_a_second_when_the_database_"
    "hangs": "1 s bound",
    "tests/e2e/test_not_migrated.py::test_readyz_answers_within_a_second_when_queries_hang":
        "1 s bound",
    # A healthy owner or target is served within seconds beside hanging ones.
    "tests/e2e/test_owner_caps.py::test_one_owners_hanging_subscriptions_leave_room_for_"
    "others": "5 s bound",
    "tests/e2e/test_worker_outcomes.py::test_hanging_target_does_not_delay_a_healthy_one":
        "3 s bound",
    "tests/e2e/test_worker_outcomes.py::test_many_hanging_targets_hold_one_slot_each_once_"
    "they_time_out": "4 s bound",
    # DNS lookups time out together, between 1.4 and 4 s.
    "tests/e2e/test_dns.py::test_lookup_times_out_and_others_are_not_held_up": "1.4-4 s",
    # A page of the delivery log in under 0.5 s.
    "tests/e2e/test_delivery_log.py::test_newest_page_is_an_index_scan": "0.5 s bound",
    # Writers' latency under 1 s during a 100k-row backfill.
    "tests/e2e/test_backfill.py::test_writers_latency_during_a_100k_backfill": "1 s bound",
    # Workers and the API recover from hung connections within their deadlines' bounds.
    "tests/e2e/test_db_hangs.py": "recovery bounds",
    # Failover between private clusters within a bound.
    "tests/e2e/test_db_failover.py": "failover bound",
    # The capacity in flight and the per-target windows adapt to measured latencies.
    "tests/e2e/test_capacity.py": "capacity under load",
    "tests/e2e/test_adaptive.py": "windows under load",
    # Round trips per delivery, which a slower round under load makes more of.
    "tests/e2e/test_worker.py::test_a_light_load_costs_one_round_trip_per_delivery":
        "round trips",
    # Requests per second of one token.
    "tests/e2e/test_api_limits.py::test_rate_limit_per_token": "rate",
    # Tens of thousands of deliveries, or 300,000 rows migrated, within a timeout.
    "tests/e2e/test_backfill.py::test_resumes_after_the_worker_is_killed": "60 s bound",
    "tests/e2e/test_backfill.py::test_two_workers_share_the_batches_and_queue_each_row_once":
        "60 s bound",
    "tests/e2e/test_fanout_backlog.py::test_a_backlog_is_sent_while_it_is_fanned_out":
        "60 s bound",
    "tests/db/test_partitions.py::test_migration_0005_keeps_300k_deliveries":
        "120 s timeout",
}

# Under pytest-xdist these start first, longest first, so that they overlap the rest of the
# run instead of finishing it: schemathesis against the API (minutes), the chaos run (its
# own cluster on a fixed port; 1-3 minutes), then those of a minute or more.
EARLY = [
    "tests/db/test_fuzz.py",
    "tests/e2e/test_chaos.py",
    "tests/db/test_partitions.py::test_retention_drops_old_days_and_keeps_pending_work",
    "tests/db/test_partitions.py::test_two_pruners_at_once",
    "tests/db/test_partitions.py::test_claim_plan_holds_whatever_the_statistics",
    "tests/db/test_partitions.py::test_fanout_plan_holds_whatever_the_statistics",
    "tests/e2e/test_dashboard.py",
    "tests/e2e/test_devdb_port.py",
    "tests/e2e/test_installed_package.py",
    "tests/e2e/test_security_api.py",
    "tests/e2e/test_strict_ordering.py",
    "tests/e2e/test_strict_parking.py",
    "tests/e2e/test_upgrade.py",
]


def _matches(nodeid: str, prefix: str) -> bool:
    return nodeid == prefix or nodeid.startswith((prefix + "::", prefix + "["))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test with its folder's layer (a test outside them is an error), and the
    tests of SERIAL `serial`; under pytest-xdist, starts the tests of EARLY first."""
    for prefix in [*SERIAL, *EARLY]:
        if not (TESTS.parent / prefix.split("::")[0]).is_file():
            raise pytest.UsageError(f"tests/conftest.py names {prefix}, which is not there")
    for item in items:
        folder = item.path.resolve().relative_to(TESTS).parts[0]
        if folder not in LAYERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in tests/unit, tests/db or "
                                    "tests/e2e, by the layer they need")
        item.add_marker(folder)
        if any(_matches(item.nodeid, prefix) for prefix in SERIAL):
            item.add_marker("serial")
    if hasattr(config, "workerinput"):
        def rank(item: pytest.Item) -> int:
            return next((i for i, prefix in enumerate(EARLY) if _matches(item.nodeid, prefix)),
                        len(EARLY))
        items.sort(key=rank)
