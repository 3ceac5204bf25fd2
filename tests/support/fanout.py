"""Fanning out the whole outbox at once, for tests that capture changes and want their
deliveries made without a worker running."""

from __future__ import annotations

from dataclasses import dataclass

from service.store import Store
from service.worker.fanout import DEFAULT_MAX_ROW_BYTES, fan_out_batch


@dataclass
class Drained:
    """What one drain_outbox call did."""

    taken: int = 0  # outbox rows (statements) processed
    changes: int = 0  # changed rows they held
    created: int = 0  # deliveries created
    rejected: int = 0  # changes set aside
    locked: bool = True  # False when another worker held the fan-out lock


async def drain_outbox(store: Store, batch_size: int,
                       max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Drained:
    """Fans out batches until the outbox is empty (or another worker is doing it)."""
    done = Drained()
    while True:
        batch = await fan_out_batch(store, batch_size, max_row_bytes)
        done.taken += batch.taken
        done.changes += batch.changes
        done.created += batch.created
        done.rejected += batch.rejected
        done.locked = batch.locked
        if not batch.locked or batch.taken < batch_size:
            return done
