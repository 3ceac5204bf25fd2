"""Backfills (sql/backfill.sql): each worker runs the running backfills a
batch at a time, as a supervised side task.

A batch is one short transaction (webhooks.backfill_step): it takes a running backfill
FOR UPDATE SKIP LOCKED, reads up to BATCH_SIZE rows of the current table after its cursor
with a plain SELECT, queues their snapshots as events and deliveries, and moves the
cursor, all committed together. So a worker killed mid-backfill loses nothing and queues
nothing twice: the next batch, on any worker, starts from the committed cursor. A
backfill queues at most about WEBHOOKS_BACKFILL_AHEAD deliveries ahead of its target: a
batch waits until the first delivery of the batch that many rows back has left the queue,
so a backfill never floods the queue and slows down with a slow target.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from service.config import Settings
from service.store import Store, StoreError

log = logging.getLogger("webhooks.worker")

# Rows read per batch (one transaction each).
BATCH_SIZE = 500
# How long to wait when no backfill is ready: from FIRST_WAIT (a gate that opens within
# milliseconds) doubling up to IDLE_WAIT (no backfill running).
FIRST_WAIT = 0.02
IDLE_WAIT = 1.0


async def run_batch(store: Store, settings: Settings, batch_size: int = BATCH_SIZE
                    ) -> dict[str, Any] | None:
    """One batch of a ready backfill, committed; None when no backfill is ready."""
    ahead = max(1, -(-settings.backfill_ahead // batch_size))  # in batches, rounded up
    async with store.transaction() as s:
        row = await s.backfill_step(batch_size=batch_size,
                                    max_row_bytes=settings.max_row_bytes, ahead=ahead)
    return dict(row) if row is not None else None


async def backfill_loop(store: Store, settings: Settings, on_batch: Callable[[], None],
                        batch_size: int = BATCH_SIZE) -> None:
    """Runs batches while any backfill is ready, else waits; until cancelled.
    `on_batch` is called after a batch queued deliveries (the worker claims them)."""
    wait = FIRST_WAIT
    while True:
        try:
            row = await run_batch(store, settings, batch_size)
        except StoreError as exc:
            # The database restarting, a timeout: the committed cursor is where we resume.
            log.warning("backfill batch failed, will retry: %s", exc)
            row = None
            wait = IDLE_WAIT
        if row is None:
            await asyncio.sleep(wait)
            wait = min(wait * 2, IDLE_WAIT)
            continue
        wait = FIRST_WAIT
        if row["queued"]:
            on_batch()
        if row["status"] != "running":
            log.info("backfill %d of webhook %d %s: %d rows", row["backfill_id"],
                     row["subscription_id"], row["status"], row["rows"])
