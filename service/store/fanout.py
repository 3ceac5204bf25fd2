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
    # Leasing what the batch makes on a quiet queue: up to `take` deliveries (0: none)
    # within the caps, as the claim's parameters of the same names give them.
    take: int
    lease: float
    per_target: int
    per_owner: int
    busy_ids: list[int]
    busy_counts: list[int]
    saturated: list[int]
    degraded: list[int]
    owner_names: list[str]
    owner_counts: list[int]
    saturated_owners: list[str]


class FanoutQueries(AsyncQueries):
    """The outbox's fan-out."""

    async def fanout(self, into: type[Batch], params: FanoutParams) -> Batch | None:
        """Fans out up to `limit` outbox rows in one statement; what it did, as `into`."""
        return await self._one("fanout", params, row=class_row(into))

    async def reject_first_change(self, *, lock_key: int, reason: str) -> int:
        """Sets the first outbox statement aside whole; the rows it set aside."""
        return await self._run("fanout_reject_first", {"lock_key": lock_key, "reason": reason})
