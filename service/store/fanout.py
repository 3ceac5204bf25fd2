"""Fan-out (sql/queries/fanout.sql): outbox rows become events and deliveries."""

from __future__ import annotations

from typing import TypeVar

from psycopg.rows import class_row

from service.store.base import AsyncQueries, one_signature
from service.store.worker import LeaseParams

Batch = TypeVar("Batch")


class FanoutParams(LeaseParams):
    """The parameters of one fan-out statement; with `take` above 0 (and the caps of
    LeaseParams), it leases up to `take` of the deliveries it makes on a quiet queue."""

    lock_key: int
    limit: int
    max_row_bytes: int
    careful: bool
    take: int


class FanoutQueries(AsyncQueries):
    """The outbox's fan-out."""

    async def fanout(self, into: type[Batch], params: FanoutParams) -> Batch | None:
        """Fans out up to `limit` outbox rows in one statement; what it did, as `into`."""
        return await self._one("fanout", one_signature(params), row=class_row(into))

    async def reject_first_change(self, *, lock_key: int, reason: str) -> int:
        """Sets the first outbox statement aside whole; the rows it set aside."""
        return await self._run("fanout_reject_first", {"lock_key": lock_key, "reason": reason})

    async def end_stuck_fanout(self, *, lock_key: int, stuck: float) -> int:
        """Ends the backend that holds the fan-out's lock waiting for its client in a
        transaction older than `stuck` seconds (fanout_end_stuck); how many were ended."""
        row = await self._one("fanout_end_stuck", {"lock_key": lock_key, "stuck": stuck})
        return int(row["ended"]) if row else 0
