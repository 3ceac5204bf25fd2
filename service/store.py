"""The store: every named query of the service runs through here (sql/queries/*.sql), and
database errors leave it as the service's own exceptions.

The API and the worker hold a `Store` over their pool; the commands, which use one plain
connection, call `run_sync`. Nothing else executes a named query, and nothing outside this
module catches psycopg's exceptions (import-linter keeps service.db, the plumbing, away
from the API and the worker).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import AsyncRowFactory, RowFactory, dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from service.db import conninfo, query

Row = TypeVar("Row")
Params = Mapping[str, Any] | None


class StoreError(Exception):
    """A named query failed; `sqlstate` is PostgreSQL's code, when it gave one."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class StoreUnavailable(StoreError):
    """The database could not be reached, or the connection broke: try again later."""


class StoreRejected(StoreError):
    """The database refused the statement (its data, a constraint, a timeout)."""

    @property
    def data_error(self) -> bool:
        """Whether the data was at fault (SQLSTATE classes 22 and 54), not the statement."""
        return (self.sqlstate or "")[:2] in ("22", "54")

    @property
    def timed_out(self) -> bool:
        """Whether a statement or lock timeout cancelled the statement."""
        return self.sqlstate in ("57014", "55P03")


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Turns psycopg's and the network's errors into StoreError subclasses."""
    try:
        yield
    except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, OSError) as exc:
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate and sqlstate[:2] not in ("08", "53", "57"):
            raise StoreRejected(str(exc), sqlstate) from exc
        if sqlstate in ("57014", "55P03"):
            raise StoreRejected(str(exc), sqlstate) from exc
        raise StoreUnavailable(str(exc) or type(exc).__name__, sqlstate) from exc
    except psycopg.Error as exc:
        raise StoreRejected(str(exc), exc.sqlstate) from exc


class Session:
    """Named queries on one connection (inside `Store.transaction`, one transaction)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def one(self, name: str, params: Params = None, *,
                  row: AsyncRowFactory[Row] | None = None) -> Any:
        """The first row of the named query (a dict unless `row` says), or None."""
        with translated():
            cur = self._conn.cursor(row_factory=row or dict_row)
            await cur.execute(query(name), params)
            return await cur.fetchone()

    async def all(self, name: str, params: Params = None, *,
                  row: AsyncRowFactory[Row] | None = None) -> list[Any]:
        """Every row of the named query (dicts unless `row` says)."""
        with translated():
            cur = self._conn.cursor(row_factory=row or dict_row)
            await cur.execute(query(name), params)
            return await cur.fetchall()

    async def run(self, name: str, params: Params = None) -> int:
        """Runs the named statement; returns its row count."""
        with translated():
            cur = await self._conn.execute(query(name), params)
            return cur.rowcount

    async def execute(self, statement: sql.SQL | sql.Composed) -> None:
        """Runs a statement composed with psycopg.sql (DDL that names relations)."""
        with translated():
            await self._conn.execute(statement)


class Store:
    """The named queries of the service over one connection pool."""

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

    async def one(self, name: str, params: Params = None, *,
                  row: AsyncRowFactory[Row] | None = None) -> Any:
        """The first row of the named query, on a connection of its own."""
        async with self.session() as s:
            return await s.one(name, params, row=row)

    async def all(self, name: str, params: Params = None, *,
                  row: AsyncRowFactory[Row] | None = None) -> list[Any]:
        """Every row of the named query, on a connection of its own."""
        async with self.session() as s:
            return await s.all(name, params, row=row)

    async def run(self, name: str, params: Params = None) -> int:
        """Runs the named statement on a connection of its own; returns its row count."""
        async with self.session() as s:
            return await s.run(name, params)

    async def pipelined(self, first: tuple[str, Params, AsyncRowFactory[Any]],
                        second: tuple[str, Params, AsyncRowFactory[Any]]
                        ) -> tuple[list[Any], list[Any]]:
        """Every row of two named queries sent together: one round trip and one
        transaction, so the second sees what the first wrote. An error in either raises,
        and neither is committed."""
        with translated():
            async with self.pool.connection() as conn, conn.pipeline() as pipe:
                cursors = []
                for name, params, row in (first, second):
                    cur = conn.cursor(row_factory=row)
                    await cur.execute(query(name), params)
                    cursors.append(cur)
                await pipe.sync()
                return await cursors[0].fetchall(), await cursors[1].fetchall()


def run_sync(conn: psycopg.Connection[Any], name: str, params: Params = None, *,
             row: RowFactory[Any] = tuple_row) -> list[Any]:
    """The commands' way to run a named query on their one plain connection."""
    with translated():
        cur = conn.cursor(row_factory=row)
        cur.execute(query(name), params)
        return cur.fetchall() if cur.description else []


def run_many_sync(conn: psycopg.Connection[Any], name: str,
                  params: list[Mapping[str, Any]]) -> None:
    """The named statement once per parameter set, in one round trip's pipeline."""
    with translated(), conn.cursor() as cur:
        cur.executemany(query(name), params)


async def connect(url: str, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """An autocommit connection outside the pools (the worker's LISTEN connection), with
    the same session settings as theirs."""
    return await psycopg.AsyncConnection.connect(conninfo(url), autocommit=True, **kwargs)


def make_pool(url: str, *, min_size: int = 1, max_size: int = 10, name: str = "webhooks"
              ) -> AsyncConnectionPool:
    """An unopened async pool; the caller opens it (`await pool.open(wait=True)`) and closes it.

    Connections are not checked at every checkout: that costs a round trip per query on
    the hot paths. A connection that died (a server restart) fails its next query, is
    discarded by the pool, and the caller's error handling applies: the worker retries,
    the API answers 503 for that request.
    """
    return AsyncConnectionPool(
        conninfo(url),
        min_size=min_size,
        max_size=max_size,
        open=False,
        name=name,
        kwargs={"autocommit": True, "application_name": f"webhooks-{name}"},
    )
