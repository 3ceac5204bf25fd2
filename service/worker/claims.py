"""The worker's claims, as its loop makes them: the lane's walk of other queues before a
claim (others_due), the claim with the parameters pacing builds, the close of the queues
of inactive subscriptions it met, the query of when the next delivery is due after a
claim that found nothing, and the waiting claims of degraded subscriptions given back.
Also the queue's statements prepared on each new queue connection."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg

from service.config import Settings
from service.store import Session, Store, StoreError, StoreRejected
from service.worker import delivery
from service.worker.delivery import Claim
from service.worker.fanout import PREPARE_LOCK, FanoutBatch, fanout_params
from service.worker.metrics import WorkerMetrics
from service.worker.pacing import LANE_STEPS, LANE_TAKE, Pacing, claim_params
from service.worker.slots import Slots
from service.worker.upkeep import Upkeep

log = logging.getLogger("webhooks.worker")

# Deliveries of inactive subscriptions closed per statement (Claims.close_inactive).
CLOSE_BATCH = 5_000


class Claims:
    """The claims' round trips: on `queue` (the claim and what goes with it) and on
    `store` (next_due, the claims given back)."""

    def __init__(self, store: Store, queue: Store, settings: Settings, *, slots: Slots,
                 pacing: Pacing, upkeep: Upkeep, metrics: WorkerMetrics) -> None:
        self.store = store
        self.queue = queue
        self.settings = settings
        self.slots = slots
        self.pacing = pacing
        self.upkeep = upkeep
        self.metrics = metrics
        # The round trips made (webhooks_worker_db_round_trips_total, read at each scrape).
        self.round_trips = 0

    async def claim(self, wanted: int, now: float) -> list[Claim]:
        """The rows of a claim of up to `wanted` deliveries (unordered, inactive ones
        included), with the lane's queues when its walk is due."""
        await self.walk(now)
        self.round_trips += 1
        return await self.queue.claim(Claim, self.pacing.claim_params(wanted))

    async def walk(self, now: float) -> None:
        """Looks for other queues with due deliveries, for the claims to take from beside
        the oldest, when the lane is due (Pacing.lane_due, Lane; others_due in
        sql/queries/worker.sql)."""
        if not self.pacing.lane_due(now):
            return
        self.round_trips += 1
        try:
            others = await self.queue.others_due(
                after=self.pacing.lane_after, steps=LANE_STEPS, take=LANE_TAKE,
                busy=list(self.slots.busy), since=self.pacing.since)
        except StoreRejected as exc:
            # The lane only helps the claim: a walk the database refuses (a statement
            # timeout on a huge queue, say) leaves the claim to run without it.
            log.warning("the walk of other queues failed; claiming without it: %s", exc)
            self.pacing.lane_ran(None, now, asyncio.get_running_loop().time())
            return
        self.pacing.lane_ran(others, now, asyncio.get_running_loop().time())

    async def close_inactive(self, rows: list[Claim]) -> None:
        """Closes, batch after batch, the rest of the due queue of the subscriptions the
        claim found inactive (it closes what it meets of them within its caps, oldest
        first): a large queue of a subscription made inactive never stands before every
        other subscription's (close_inactive in sql/queries/worker.sql)."""
        ids = delivery.inactive(rows)
        while ids:
            self.round_trips += 1
            closed = await self.queue.close_inactive(subscription_ids=ids, limit=CLOSE_BATCH)
            self.metrics.closed_inactive.inc(closed)
            if closed < CLOSE_BATCH:
                return

    async def paced(self, claims: list[Claim], wanted: int, now: float,
                    until_fanout: float) -> float:
        """How long to wait after a claim that asked for `wanted` (its attempts started),
        asking when the next delivery is due when the claim found nothing."""
        wait = self.pacing.claimed(claims, wanted, now)
        if self.pacing.drained:
            self.upkeep.drained()
        if wait is None:
            self.round_trips += 1
            due, self.pacing.since = await self.store.next_due(
                saturated=self.slots.saturated(), saturated_owners=self.slots.saturated_owners())
            wait = self.pacing.next_due(due, now)
        return min(wait, until_fanout)

    async def give_back_stranded(self) -> None:
        """Gives back the waiting claims of subscriptions that became degraded."""
        stranded = self.slots.stranded()
        if stranded:
            self.round_trips += 1
            await delivery.release(self.store, stranded)
            self.pacing.ask()

    async def prepare(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Runs the queue's statements once on a new connection of the queue pool (its
        `configure`), changing nothing: a fan-out and a claim of nothing, a record of no
        outcome. Each is prepared there, on its one parameter signature (one_signature in
        service/store/base.py), and its generic plan built (the fan-out's: 7-14 ms), before
        a change's delivery waits for it: a fresh worker's first deliveries, and those
        after a connection's hourly renewal, waited for that planning."""
        s = Session(conn)
        # A scan of nothing too: the claim locks the due deliveries it scans until its
        # transaction ends, and another connection's claim passes over those (the oldest
        # ones: later ones were sent first while a new connection was being prepared).
        lease = claim_params(limit=0, per_target=self.slots.initial, busy={},
                             lease=self.settings.lease, scan=0,
                             per_owner=self.slots.per_owner, busy_owners={})
        try:
            for params in (fanout_params(0, self.settings.max_row_bytes),  # the catch-up's
                           fanout_params(0, self.settings.max_row_bytes, lease=lease)):
                await s.fanout(FanoutBatch, params | {"lock_key": PREPARE_LOCK})
            await s.claim(Claim, lease)
            await s.record(batch="[]")
        except StoreError as exc:
            # Only a head start: the statements are prepared at their first use anyway,
            # and what failed here fails there, where the loop handles it.
            log.warning("could not prepare the queue's statements on a new connection: %s",
                        exc)
