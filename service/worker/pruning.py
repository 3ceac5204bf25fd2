"""Retention: the queue tables' daily partitions are created ahead and dropped whole once
past retention (sql/partitions.sql); old crash records of worker tasks are deleted.

A partition goes in three steps, none of which blocks writers, claims or readers: DETACH
PARTITION ... CONCURRENTLY (the parent is locked in SHARE UPDATE EXCLUSIVE mode only),
a check of the detached table, DROP TABLE. The check catches a delivery requeued
(redeliver, recover) after the partition was chosen: the table is attached again and
kept. A detach interrupted by a crash or a lock timeout is finished on the next round.

The partitions go one at a time, each after a pause of DROP_SPACING times what the one
before it took: freeing a partition's files holds up the flushes of the application's
own commits on the same disk, and back-to-back drops held up a sixth of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from service.store import Session, Store, StoreError

log = logging.getLogger("webhooks.worker")

# Retention runs this often (and once when the worker starts).
PRUNE_EVERY = 60.0
# Partitions are created this many days ahead of today.
PARTITIONS_AHEAD = 2
# A detach or an attach waits at most this long for its lock, then tries next round.
LOCK_TIMEOUT = "2s"
# pg_try_advisory_lock key: one pruner at a time.
PRUNE_LOCK = 7315600212945527044
# After a partition is gone, the next one waits this many times as long as it took (at
# most DROP_PAUSE_MAX seconds): each drop frees its files and delays the application's
# commits flushed meanwhile, so spaced drops hold the disk about 1% of the time
# (measurements: docs/performance.md, retention; bench/FINDINGS.md, retention).
DROP_SPACING = 100.0
DROP_PAUSE_MAX = 10.0


async def prune(store: Store, retention: float) -> int:
    """Creates the partitions ahead, drops those past retention and deletes old crash
    records; returns how many partitions were dropped."""
    await store.ensure_partitions(ahead=PARTITIONS_AHEAD)
    await store.prune_worker_tasks(retention=retention)
    dropped = 0
    async with store.session() as s:
        if not await s.lock_partitions(key=PRUNE_LOCK):
            return 0
        try:
            await s.close_orphan_partitions()
            await s.set_lock_timeout(LOCK_TIMEOUT)
            pause = 0.0
            for part in await s.expired_partitions(retention=retention):
                await asyncio.sleep(pause)
                started = time.monotonic()
                if not await _drop(s, part, retention):
                    break
                dropped += 1
                pause = min(DROP_PAUSE_MAX, DROP_SPACING * (time.monotonic() - started))
        finally:
            await s.reset_lock_timeout()
            await s.unlock_partitions(key=PRUNE_LOCK)
    return dropped


async def _drop(s: Session, part: dict[str, Any], retention: float) -> bool:
    """Detaches, checks and drops one partition; False when it is kept."""
    await s.detach_partition(parent=part["parent"], partition=part["partition"],
                             finalize=bool(part["detach_pending"]))
    if part["parent"] == "deliveries" and await s.keep_detached(
            partition=part["partition"], lower_bound=part["lower_bound"],
            upper_bound=part["upper_bound"], retention=retention):
        log.info("retention: kept %s, a delivery in it was requeued", part["partition"])
        return False
    await s.drop_partition(partition=part["partition"])
    log.info("retention: dropped %s", part["partition"])
    return True


async def prune_loop(store: Store, retention: float) -> None:
    """Prunes at once and then every PRUNE_EVERY seconds until cancelled; database errors
    (a lock not granted in time, say) skip a round."""
    while True:
        try:
            await prune(store, retention)
        except StoreError as exc:
            log.warning("retention failed, will retry: %s", exc)
        await asyncio.sleep(PRUNE_EVERY)
