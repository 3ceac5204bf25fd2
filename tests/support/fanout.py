"""Fanning out without a worker running: the whole outbox at once (drain_outbox), for
tests that capture changes and want their deliveries made; one batch of a quiet queue's
fan-out that leases what it makes (fan_out, lease, leased_rows)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from service.store import Store
from service.store.worker import ClaimParams
from service.worker.fanout import (
    DEFAULT_MAX_ROW_BYTES,
    FanoutBatch,
    fan_out_batch,
    fanout_params,
)
from service.worker.pacing import claim_params
from tests.support.worker import open_pool


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


def lease(limit: int = 10, per_target: int = 8, busy: dict[int, int] | None = None,
          degraded: tuple[int, ...] = (), per_owner: int | None = None,
          busy_owners: dict[str, int] | None = None) -> ClaimParams:
    """The claim's parameters a fan-out leases what it makes by (the fanout query's
    `take`)."""
    return claim_params(limit=limit, per_target=per_target, busy=busy or {}, lease=60.0,
                        scan=100, degraded=degraded, per_owner=per_owner,
                        busy_owners=busy_owners)


async def fan_out(db_url: str, claim: ClaimParams) -> FanoutBatch:
    """One fan-out batch, leasing by `claim`, on a pool of its own."""
    async with open_pool(db_url) as pool:
        batch = await Store(pool).fanout(FanoutBatch, fanout_params(100, 1 << 20, lease=claim))
    assert batch is not None
    return batch


def leased_rows(conn: psycopg.Connection) -> list[tuple[int, int]]:
    """(subscription_id, attempts) of the deliveries made leased, by id."""
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT subscription_id, attempts FROM webhooks.deliveries"
        " WHERE lease_expires_at > now() AND next_attempt_at = lease_expires_at"
        " ORDER BY id").fetchall()]
