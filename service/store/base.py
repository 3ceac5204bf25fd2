"""What every area's methods run on: a named query's first row, every row, or its row
count, on an async connection (Session, Store) or on the commands' plain one (SyncStore).

The text of a query comes from service.db.query (sent without its comments, so that psycopg
caches its parsing); errors leave as StoreError (errors.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import AsyncRowFactory, RowFactory, dict_row, tuple_row

from service.db import query
from service.store.errors import translated

Params = Mapping[str, Any] | None


class AsyncQueries:
    """The primitives of the async areas: Session runs them on its connection, Store on
    a pooled connection per call."""

    async def _one(self, name: str, params: Params = None,
                   row: AsyncRowFactory[Any] = dict_row) -> Any:
        """The first row of the named query (a dict unless `row` says), or None."""
        raise NotImplementedError

    async def _all(self, name: str, params: Params = None,
                   row: AsyncRowFactory[Any] = dict_row) -> list[Any]:
        """Every row of the named query (dicts unless `row` says)."""
        raise NotImplementedError

    async def _run(self, name: str, params: Params = None) -> int:
        """Runs the named statement; returns its row count."""
        raise NotImplementedError


class SyncQueries:
    """The primitives of the commands' areas, on their one plain connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def _rows(self, name: str, params: Params = None,
              row: RowFactory[Any] = tuple_row) -> list[Any]:
        """Every row of the named query (tuples unless `row` says); none for a statement."""
        with translated():
            cur = self.conn.cursor(row_factory=row)
            cur.execute(query(name), params)
            return cur.fetchall() if cur.description else []

    def _many(self, name: str, params: Sequence[Mapping[str, Any]]) -> None:
        """The named statement once per parameter set, in one round trip's pipeline."""
        with translated(), self.conn.cursor() as cur:
            cur.executemany(query(name), params)
