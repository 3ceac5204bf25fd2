"""Fan-out (sql/queries/fanout.sql): outbox rows become events and deliveries."""

from __future__ import annotations

from typing import TypedDict, TypeVar

from psycopg.rows import class_row

from service.store.base import AsyncQueries

Batch = TypeVar("Batch")


class FanoutParams(TypedDict):
    """The parameters of one fan-out statement."""

    lock_key: int
    limit: int
    max_row_bytes: int
    careful: bool


class FanoutQueries(AsyncQueries):
    """The outbox's fan-out."""

    async def fanout(self, into: type[Batch], *, lock_key: int, limit: int,
                     max_row_bytes: int, careful: bool) -> Batch | None:
        """Fans out up to `limit` outbox rows in one statement; what it did, as `into`."""
        return await self._one("fanout", {"lock_key": lock_key, "limit": limit,
                                          "max_row_bytes": max_row_bytes,
                                          "careful": careful}, row=class_row(into))

    async def reject_first_change(self, *, lock_key: int, reason: str) -> int:
        """Sets the first outbox statement aside whole; the rows it set aside."""
        return await self._run("fanout_reject_first", {"lock_key": lock_key, "reason": reason})
