"""Backfills (sql/queries/backfill.sql): the API starts and follows them, the worker runs
their batches, `webhooks status` lists them."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from service.store.base import AsyncQueries, SyncQueries


class BackfillQueries(AsyncQueries):
    """A subscription's backfills, and their batches."""

    async def start_backfill(self, *, subscription_id: int, max_per_owner: int | None
                             ) -> dict[str, Any]:
        """Starts a backfill of the subscription ({"id"}), unless its owner already runs
        `max_per_owner`; raises when it cannot."""
        return await self._one("backfill_start", {"subscription_id": subscription_id,
                                                  "max_per_owner": max_per_owner})

    async def unreadable_table(self, *, subscription_id: int) -> str | None:
        """Why a table of the subscription's events may not be read any more (it is then
        forgotten, as DROP TABLE would forget it), or None; in a transaction of its own."""
        row = await self._one("backfill_check_tables", {"subscription_id": subscription_id})
        return None if row is None else row["problem"]

    async def get_backfill(self, *, id: int, subscription_id: int) -> dict[str, Any] | None:
        """One backfill of the subscription ({"body"}), or None."""
        return await self._one("backfill_get", {"id": id, "subscription_id": subscription_id})

    async def list_backfills(self, *, subscription_id: int, limit: int
                             ) -> list[dict[str, Any]]:
        """The subscription's backfills ({"body"}), newest first."""
        return await self._all("backfill_list",
                               {"subscription_id": subscription_id, "limit": limit})

    async def backfill_step(self, *, batch_size: int, max_row_bytes: int, ahead: int
                            ) -> dict[str, Any] | None:
        """One batch of a ready backfill, or None when none is ready."""
        return await self._one("backfill_step", {"batch_size": batch_size,
                                                 "max_row_bytes": max_row_bytes,
                                                 "ahead": ahead})


class SyncBackfillQueries(SyncQueries):
    """Backfills, as `webhooks status` shows them."""

    def status_backfills(self) -> list[dict[str, Any]]:
        """The recent backfills and their progress."""
        return self._rows("status_backfills", row=dict_row)
