"""Fan-out: captured changes leave the outbox as events with one delivery per subscriber."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg.rows import class_row
from psycopg_pool import AsyncConnectionPool

from service.db import query

# Held (per transaction) by the one worker fanning out at a time: see the fanout query.
FANOUT_LOCK = 0x77686B66  # "whkf"


@dataclass(frozen=True)
class FanoutBatch:
    """What one fan-out statement did."""

    locked: bool
    taken: int  # outbox rows (statements)
    changes: int  # changed rows they held
    created: int


# Rows whose JSON is larger than this are delivered without their `resource` member.
DEFAULT_MAX_ROW_BYTES = 256 * 1024


async def fan_out_batch(pool: AsyncConnectionPool, limit: int,
                        max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> FanoutBatch:
    """Moves up to `limit` outbox rows to events and deliveries, in one transaction."""
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=class_row(FanoutBatch))
        await cur.execute(query("fanout"), {"lock_key": FANOUT_LOCK, "limit": limit,
                                            "max_row_bytes": max_row_bytes})
        row = await cur.fetchone()
    assert row is not None
    return row


@dataclass
class Drained:
    """What one drain_outbox call did."""

    taken: int = 0  # outbox rows (statements) processed
    changes: int = 0  # changed rows they held
    created: int = 0  # deliveries created
    locked: bool = True  # False when another worker held the fan-out lock


async def drain_outbox(pool: AsyncConnectionPool, batch_size: int,
                       max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Drained:
    """Fans out batches until the outbox is empty (or another worker is doing it)."""
    done = Drained()
    while True:
        batch = await fan_out_batch(pool, batch_size, max_row_bytes)
        done.taken += batch.taken
        done.changes += batch.changes
        done.created += batch.created
        done.locked = batch.locked
        if not batch.locked or batch.taken < batch_size:
            return done
