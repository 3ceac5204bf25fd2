"""Session (one connection) and Store (a pool) with every async area's methods, and the
pool they run on."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import cache
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import AsyncRowFactory, class_row, dict_row
from psycopg_pool import AsyncConnectionPool

from service.db import CONNECT_TIMEOUT, TCP_TIMEOUT, conninfo, raw_query, server_settings
from service.store.api import ApiQueries
from service.store.backfill import BackfillQueries
from service.store.base import Params, one_signature
from service.store.deadline import checked_out, first_try, made_now, watched
from service.store.deliveries import DeliveryQueries
from service.store.errors import StoreUnavailable, translated
from service.store.fanout import FanoutParams, FanoutQueries
from service.store.rotation import RotationQueries
from service.store.status import StatusQueries
from service.store.tokens import TokenQueries
from service.store.worker import ClaimParams, ConnectionQueries, WorkerQueries

Batch = TypeVar("Batch")
Claimed = TypeVar("Claimed")


class Queries(ApiQueries, DeliveryQueries, RotationQueries, BackfillQueries, FanoutQueries,
              WorkerQueries, StatusQueries, TokenQueries):
    """Every area's methods that may run on a connection of their own."""


async def _execute_named(conn: psycopg.AsyncConnection[Any], name: str, params: Params,
                   row: AsyncRowFactory[Any]) -> psycopg.AsyncRawCursor[Any]:
    """The named query executed on `conn` with PostgreSQL's placeholders (db.raw_query)."""
    text, names = raw_query(name)
    cur = psycopg.AsyncRawCursor(conn, row_factory=row)
    await cur.execute(text, [params[n] for n in names] if params is not None else None)
    return cur


async def _fetch_one(conn: psycopg.AsyncConnection[Any], name: str, params: Params,
                     row: AsyncRowFactory[Any]) -> Any:
    """The first row of the named query on `conn` (errors untranslated: the caller's)."""
    cur = await _execute_named(conn, name, params, row)
    return await cur.fetchone()


async def _fetch_all(conn: psycopg.AsyncConnection[Any], name: str, params: Params,
                     row: AsyncRowFactory[Any]) -> list[Any]:
    """Every row of the named query on `conn` (errors untranslated: the caller's)."""
    cur = await _execute_named(conn, name, params, row)
    return await cur.fetchall()


# The client-side deadline of a statement and of a checkout when the store is given none
# (WEBHOOKS_WORKER_DB_TIMEOUT's default).
DEFAULT_TIMEOUT = 10.0

_WRITES = re.compile(r"\b(insert|update|delete|merge|nextval|setval|set_config|pg_notify|"
                     r"pg_\w*advisory\w*|pg_terminate_backend|pg_cancel_backend|lock)\b"
                     r"|\bwebhooks\.\w+\s*\(", re.IGNORECASE)


@cache
def is_read(name: str) -> bool:
    """Whether the named query only reads: a SELECT (or WITH) that names no statement or
    function that writes, and no function of the service (some of which write). Such a
    query is sent again, once, on a new connection when its connection broke."""
    text = raw_query(name)[0].decode()
    head = text.lstrip().split(None, 1)[0].lower() if text.strip() else ""
    return head in ("select", "with") and not _WRITES.search(text)


@contextlib.asynccontextmanager
async def _transaction(conn: psycopg.AsyncConnection[Any], timeout: float
                       ) -> AsyncIterator[None]:
    """A transaction on `conn` whose BEGIN and COMMIT (or ROLLBACK) each end within
    `timeout`, as the statements between them do (Session)."""
    tx = conn.transaction()
    with watched(conn, timeout):
        await tx.__aenter__()
    try:
        yield
    except BaseException as exc:
        with watched(conn, timeout):
            if await tx.__aexit__(type(exc), exc, exc.__traceback__):
                return
        raise
    with watched(conn, timeout):
        await tx.__aexit__(None, None, None)


class Session(Queries, ConnectionQueries):
    """The named queries on one connection (inside `Store.transaction`, one transaction),
    each within `timeout` seconds (service.store.deadline)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any],
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self._conn = conn
        self._timeout = timeout

    async def _one(self, name: str, params: Params = None,
                   row: AsyncRowFactory[Any] = dict_row) -> Any:
        with translated(), watched(self._conn, self._timeout):
            return await _fetch_one(self._conn, name, params, row)

    async def _all(self, name: str, params: Params = None,
                   row: AsyncRowFactory[Any] = dict_row) -> list[Any]:
        with translated(), watched(self._conn, self._timeout):
            return await _fetch_all(self._conn, name, params, row)

    async def _run(self, name: str, params: Params = None) -> int:
        with translated(), watched(self._conn, self._timeout):
            cur = await _execute_named(self._conn, name, params, dict_row)
            return cur.rowcount

    async def _execute(self, statement: sql.Composed | sql.SQL) -> None:
        with translated(), watched(self._conn, self._timeout):
            await self._conn.execute(statement)


class Store(Queries):
    """The named queries of the service over one connection pool; each method call takes
    a connection of its own (session() and transaction() share one).

    Each checkout and each statement ends within `timeout` seconds, or its connection is
    abandoned and StoreUnavailable (DeadlineExceeded) raised (service.store.deadline);
    `with_timeout` gives the same pool with another kind of work's deadline. A query that
    only reads (is_read) and fails on a broken connection is sent again, once, on another."""

    def __init__(self, pool: AsyncConnectionPool, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.pool = pool
        self.timeout = timeout

    def with_timeout(self, timeout: float) -> Store:
        """This store's pool, with `timeout` as the deadline of its checkouts and statements."""
        return Store(self.pool, timeout)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        with translated():
            async with checked_out(self.pool, self.timeout) as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """One pooled connection, each statement its own transaction (autocommit)."""
        async with self._connection() as conn:
            yield Session(conn, self.timeout)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Session]:
        """One pooled connection and one transaction, committed when the block ends."""
        async with self._connection() as conn:
            with translated():
                async with _transaction(conn, self.timeout):
                    yield Session(conn, self.timeout)

    # One statement on a connection of its own, on the pooled connection directly rather
    # than through session() and Session: the API's reads run here, and each layer of
    # context managers cost about 4% of a GET's instructions.
    async def _one(self, name: str, params: Params = None,
                   row: AsyncRowFactory[Any] = dict_row) -> Any:
        return await self._read(_fetch_one, name, params, row)

    async def _all(self, name: str, params: Params = None,
                   row: AsyncRowFactory[Any] = dict_row) -> list[Any]:
        result: list[Any] = await self._read(_fetch_all, name, params, row)
        return result

    async def _read(self, fetch: Callable[..., Awaitable[Any]], name: str, params: Params,
                    row: AsyncRowFactory[Any]) -> Any:
        again = is_read(name)
        async with self._connection() as conn:
            try:
                with translated(), watched(conn, first_try(self.timeout) if again
                                           else self.timeout):
                    return await fetch(conn, name, params, row)
            except StoreUnavailable:
                if not again or not conn.broken:
                    raise
        # The connection broke under a read: once more, on another.
        async with self._connection() as conn:
            with translated(), watched(conn, self.timeout):
                return await fetch(conn, name, params, row)

    async def _run(self, name: str, params: Params = None) -> int:
        async with self.session() as s:
            return await s._run(name, params)

    async def fanout_and_claim(self, batch: type[Batch], claimed: type[Claimed], *,
                               fanout: FanoutParams, claim: ClaimParams
                               ) -> tuple[list[Batch], list[Claimed]]:
        """A fan-out statement and a claim sent together: one round trip and one
        transaction, so the claim sees what the fan-out made. An error in either raises,
        and neither is committed. Run on the worker's queue pool (QUEUE_SETTINGS), both
        run on their generic plans."""
        async with self._connection() as conn:
            with translated(), watched(conn, self.timeout):
                # The pipeline's exit sends the one Sync and reads both results: a sync()
                # inside the block would cost a second round trip, for the exit's own.
                async with conn.pipeline():
                    first = await _execute_named(conn, "fanout", one_signature(fanout),
                                                 class_row(batch))
                    second = await _execute_named(conn, "claim", one_signature(claim),
                                                  class_row(claimed))
                return await first.fetchall(), await second.fetchall()


async def connect(url: str, *, tcp_timeout: float = TCP_TIMEOUT,
                  connect_timeout: float = CONNECT_TIMEOUT,
                  **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """An autocommit connection outside the pools (the worker's LISTEN connection), with
    the same session settings and network options as theirs."""
    conn = await psycopg.AsyncConnection.connect(
        conninfo(url, tcp_timeout=tcp_timeout, connect_timeout=connect_timeout),
        autocommit=True, **kwargs)
    try:
        with watched(conn, connect_timeout):
            await pin_server_settings(conn)
    except BaseException:
        await conn.close()
        raise
    return conn


async def pin_server_settings(conn: psycopg.AsyncConnection[Any]) -> None:
    """Pins the settings only some servers know (service.db.SERVER_SETTINGS) on `conn`."""
    statement = server_settings(conn.info.server_version)
    if statement is not None:
        await conn.execute(statement)


# The planner settings of the worker's queue pool, where the fan-out, the claim and the
# record run. Each of them runs on one generic plan per connection (planning the claim
# anew took longer than running it: 0.8 ms with three days of partitions, 2.5 ms with a
# week's), which must hold whatever the statistics said when it was built: a day's
# partition empty or never analysed, one subscription or 100,000. With sorts, sequential
# and bitmap scans off, the claim reads the due deliveries in order from the due index and
# every statement reaches the rows it changes by key or address (a generic plan built on
# an empty partition sorted the whole queue at every claim, and the record read every
# pending delivery of the day at every batch). Set at connection: a statement setting them
# in each transaction cost a pipeline, twice the client's CPU of a plain statement.
QUEUE_SETTINGS: dict[str, str] = {
    "plan_cache_mode": "force_generic_plan",
    "enable_sort": "off",
    "enable_seqscan": "off",
    "enable_bitmapscan": "off",
}


# See make_pool.
RECONNECT_TIMEOUT = 5.0


def make_pool(url: str, *, min_size: int = 1, max_size: int = 10, name: str = "webhooks",
              timeout: float = 30.0, settings: dict[str, str] | None = None,
              prepare_threshold: int | None = 5,
              configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
              tcp_timeout: float = TCP_TIMEOUT, connect_timeout: float = CONNECT_TIMEOUT
              ) -> AsyncConnectionPool:
    """An unopened async pool; the caller opens it (`await pool.open(wait=True)`) and closes it.

    Connections are not checked by a round trip at every checkout: that costs one per
    query on the hot paths. The Store checks what it takes out (service.store.deadline:
    a connection the server closed is replaced at once, one idle for a second or more
    proves itself first), and bounds every checkout and statement; a connection that dies
    under a statement fails it, is discarded by the pool, and the caller's error handling
    applies (the worker retries, the API retries a read once, else answers 503).
    `settings` are set on each connection at start, with the network options
    (service.db.network_options); a statement is prepared at its `prepare_threshold`th
    run on a connection (psycopg's); `configure` runs on each new connection before it is
    handed out, after the settings only some servers know are pinned.
    """
    async def configured(conn: psycopg.AsyncConnection[Any]) -> None:
        with watched(conn, max(connect_timeout, 1.0)):
            await pin_server_settings(conn)
        if configure is not None:
            await configure(conn)
        made_now(conn)

    return AsyncConnectionPool(
        conninfo(url, settings, tcp_timeout=tcp_timeout, connect_timeout=connect_timeout),
        min_size=min_size,
        max_size=max_size,
        open=False,
        name=name,
        timeout=timeout,
        configure=configured,
        # psycopg_pool retries a failed connection after 1, 2, 4 ... seconds until this
        # has passed, then gives the slot up; a client that then waits makes a new attempt
        # at once. Longer, its backoff would keep a pool empty for up to half of it after
        # the database is back (a restart, a failover).
        reconnect_timeout=RECONNECT_TIMEOUT,
        kwargs={"autocommit": True, "application_name": f"webhooks-{name}",
                "prepare_threshold": prepare_threshold},
    )
