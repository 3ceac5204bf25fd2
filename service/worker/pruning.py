"""Retention: finished deliveries, unused events and old crash records are deleted."""

from __future__ import annotations

import asyncio
import logging

from service.store import Store, StoreError

log = logging.getLogger("webhooks.worker")

# Retention runs this often; each statement removes at most PRUNE_BATCH rows.
PRUNE_EVERY = 60.0
PRUNE_BATCH = 1000


async def prune(store: Store, retention: float) -> int:
    """Deletes finished deliveries (with their attempts) and unused events past retention,
    and old crash records of worker tasks; returns how many deliveries and events went."""
    total = 0
    for name in ("prune_deliveries", "prune_events"):
        while True:
            removed = await store.run(name, {"retention": retention, "limit": PRUNE_BATCH})
            total += removed
            if removed < PRUNE_BATCH:
                break
    await store.run("prune_worker_tasks", {"retention": retention})
    return total


async def prune_loop(store: Store, retention: float) -> None:
    """Prunes every PRUNE_EVERY seconds until cancelled; database errors skip a round."""
    while True:
        await asyncio.sleep(PRUNE_EVERY)
        try:
            await prune(store, retention)
        except StoreError as exc:
            log.warning("pruning failed, will retry: %s", exc)
