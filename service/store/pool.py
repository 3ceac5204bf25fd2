"""Session (one connection) and Store (a pool) with every async area's methods, and the
pool they run on."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import AsyncRowFactory, class_row, dict_row
from psycopg_pool import AsyncConnectionPool

from service.db import conninfo, raw_query
from service.store.api import ApiQueries
from service.store.backfill import BackfillQueries
from service.store.base import Params, one_signature
from service.store.deliveries import DeliveryQueries
from service.store.errors import translated
from service.store.fanout import FanoutParams, FanoutQueries
from service.store.lifecycle import LifecycleQueries
from service.store.status import StatusQueries
from service.store.tokens import TokenQueries
from service.store.worker import ClaimParams, ConnectionQueries, WorkerQueries

Batch = TypeVar("Batch")
Claimed = TypeVar("Claimed")


class Queries(ApiQueries, DeliveryQueries, LifecycleQueries, BackfillQueries, FanoutQueries,
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


class Session(Queries, ConnectionQueries):
    """The named queries on one connection (inside `Store.transaction`, one transaction)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def _one(self, name: str, params: Params = None,
                   row: AsyncRowFactory[Any] = dict_row) -> Any:
        with translated():
            return await _fetch_one(self._conn, name, params, row)

    async def _all(self, name: str, params: Params = None,
                   row: AsyncRowFactory[Any] = dict_row) -> list[Any]:
        with translated():
            return await _fetch_all(self._conn, name, params, row)

    async def _run(self, name: str, params: Params = None) -> int:
        with translated():
            cur = await _execute_named(self._conn, name, params, dict_row)
            return cur.rowcount

    async def _execute(self, statement: sql.Composed | sql.SQL) -> None:
        with translated():
            await self._conn.execute(statement)


class Store(Queries):
    """The named queries of the service over one connection pool; each method call takes
    a connection of its own (session() and transaction() share one)."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """One pooled connection, each statement its own transaction (autocommit)."""
        with translated():
            async with self.pool.connection() as conn:
                yield Session(conn)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Session]:
        """One pooled connection and one transaction, committed when the block ends."""
        with translated():
            async with self.pool.connection() as conn, conn.transaction():
                yield Session(conn)

    # One statement on a connection of its own, on the pooled connection directly rather
    # than through session() and Session: the API's reads run here, and each layer of
    # context managers cost about 4% of a GET's instructions.
    async def _one(self, name: str, params: Params = None,
                   row: AsyncRowFactory[Any] = dict_row) -> Any:
        with translated():
            async with self.pool.connection() as conn:
                return await _fetch_one(conn, name, params, row)

    async def _all(self, name: str, params: Params = None,
                   row: AsyncRowFactory[Any] = dict_row) -> list[Any]:
        with translated():
            async with self.pool.connection() as conn:
                return await _fetch_all(conn, name, params, row)

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
        with translated():
            async with self.pool.connection() as conn:
                # The pipeline's exit sends the one Sync and reads both results: a sync()
                # inside the block would cost a second round trip, for the exit's own.
                async with conn.pipeline():
                    first = await _execute_named(conn, "fanout", one_signature(fanout),
                                                 class_row(batch))
                    second = await _execute_named(conn, "claim", one_signature(claim),
                                                  class_row(claimed))
                return await first.fetchall(), await second.fetchall()


async def connect(url: str, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """An autocommit connection outside the pools (the worker's LISTEN connection), with
    the same session settings as theirs."""
    return await psycopg.AsyncConnection.connect(conninfo(url), autocommit=True, **kwargs)


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


def make_pool(url: str, *, min_size: int = 1, max_size: int = 10, name: str = "webhooks",
              timeout: float = 30.0, settings: dict[str, str] | None = None,
              prepare_threshold: int | None = 5,
              configure: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None
              ) -> AsyncConnectionPool:
    """An unopened async pool; the caller opens it (`await pool.open(wait=True)`) and closes it.

    Connections are not checked at every checkout: that costs a round trip per query on
    the hot paths. A connection that died (a server restart) fails its next query, is
    discarded by the pool, and the caller's error handling applies: the worker retries,
    the API answers 503 for that request. `settings` are set on each connection at start;
    a statement is prepared at its `prepare_threshold`th run on a connection (psycopg's);
    `configure` runs on each new connection before it is handed out.
    """
    return AsyncConnectionPool(
        conninfo(url, settings),
        min_size=min_size,
        max_size=max_size,
        open=False,
        name=name,
        timeout=timeout,
        configure=configure,
        kwargs={"autocommit": True, "application_name": f"webhooks-{name}",
                "prepare_threshold": prepare_threshold},
    )
