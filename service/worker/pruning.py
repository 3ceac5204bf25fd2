"""Retention: the queue tables' daily partitions are created ahead and dropped whole once
past retention (sql/partitions.sql); old crash records of worker tasks are deleted.

A partition goes in three steps, none of which blocks writers, claims or readers: DETACH
PARTITION ... CONCURRENTLY (the parent is locked in SHARE UPDATE EXCLUSIVE mode only),
a check of the detached table, DROP TABLE. The check catches a delivery requeued
(redeliver, recover) after the partition was chosen: the table is attached again and
kept. A detach interrupted by a crash or a lock timeout is finished on the next round.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from psycopg import sql

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


async def prune(store: Store, retention: float) -> int:
    """Creates the partitions ahead, drops those past retention and deletes old crash
    records; returns how many partitions were dropped."""
    await store.one("partitions_ensure", {"ahead": PARTITIONS_AHEAD})
    await store.run("prune_worker_tasks", {"retention": retention})
    dropped = 0
    async with store.session() as s:
        row = await s.one("partitions_lock", {"key": PRUNE_LOCK})
        if not row["locked"]:
            return 0
        try:
            await s.one("partitions_close_orphans")
            await s.execute(sql.SQL("SET lock_timeout = {}").format(LOCK_TIMEOUT))
            for part in await s.all("partitions_expired", {"retention": retention}):
                if not await _drop(s, part, retention):
                    break
                dropped += 1
        finally:
            await s.execute(sql.SQL("RESET lock_timeout"))
            await s.one("partitions_unlock", {"key": PRUNE_LOCK})
    return dropped


async def _drop(s: Session, part: dict[str, Any], retention: float) -> bool:
    """Detaches, checks and drops one partition; False when it is kept."""
    parent = sql.Identifier("webhooks", part["parent"])
    table = sql.Identifier("webhooks", part["partition"])
    how = sql.SQL("FINALIZE" if part["detach_pending"] else "CONCURRENTLY")
    await s.execute(sql.SQL("ALTER TABLE {} DETACH PARTITION {} {}").format(parent, table, how))
    if part["parent"] == "deliveries":
        check = await s.one("partitions_keep_detached", {**part, "retention": retention})
        if check["kept"]:
            log.info("retention: kept %s, a delivery in it was requeued", part["partition"])
            return False
    await s.execute(sql.SQL("DROP TABLE {}").format(table))
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
