"""What every area's methods run on: a named query's first row, every row, or its row
count, on an async connection (Session, Store) or on the commands' plain one (SyncStore).

The text of a query comes from service.db.query (sent without its comments, so that psycopg
caches its parsing); errors leave as StoreError (errors.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import AsyncRowFactory, RowFactory, dict_row, tuple_row

from service.db import query
from service.store.errors import translated

Params = Mapping[str, Any] | None


def one_signature(params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with each list sent as an array literal and each timestamp as ISO 8601 text:
    text of no declared type, which the statement's own casts type (`::bigint[]`,
    `::timestamptz`), so that the statement has one parameter signature whatever the
    values. psycopg types an empty list as unknown, a list of integers by its largest, and
    None as unknown beside a timestamp's timestamptz, and prepares each signature apart: on
    the worker's queue, each new one planned the fan-out again (7-14 ms), up to five times
    per connection before preparing it. ISO 8601 is read the same under any DateStyle."""
    return {k: _literal(v) for k, v in params.items()}


def _literal(value: Any) -> Any:
    if isinstance(value, list):
        return "{" + ",".join(_element(v) for v in value) + "}"
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool) or not isinstance(value, (int, str, datetime)):
        raise TypeError(f"no array literal for {type(value).__name__}")
    if isinstance(value, int):
        return str(value)
    text = value.isoformat() if isinstance(value, datetime) else value
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
