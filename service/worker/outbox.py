"""The outbox as the worker's loop sees it: when it fans out next, what each fan-out did
(counted, learned from by FanoutSize, told to the wakeup and to the upkeep), and a backlog
fanned out beside the loop, which claims meanwhile (the catch-up: a supervised side task,
on a queue connection of its own, that runs when the loop starts it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from service.config import Settings
from service.store import Store, StoreError, StoreRejected
from service.store.worker import ClaimParams
from service.worker import delivery
from service.worker.delivery import Claim
from service.worker.fanout import (
    FANOUT_LOCK,
    FanoutBatch,
    FanoutSize,
    fan_out_batch,
    fanout_params,
)
from service.worker.metrics import WorkerMetrics
from service.worker.pacing import MIN_WAIT
from service.worker.upkeep import Upkeep
from service.worker.wakeup import Wakeup

log = logging.getLogger("webhooks.worker")

# Seconds before the loop fans out again after a backlog's fan-out failed.
CATCH_UP_RETRY = 0.5
# Seconds without getting the fan-out's lock after which a worker ends a holder that waits
# for its client in a transaction as old (fanout_end_stuck), once per as many seconds.
STUCK_FANOUT = 30.0


class Outbox:
    """The loop's fan-outs and the catch-up of a backlog. `claim` asks the loop for a
    claim (a batch made deliveries); `wake` makes it look at the outbox again."""

    def __init__(self, store: Store, queue: Store, settings: Settings, *, wakeup: Wakeup,
                 upkeep: Upkeep, metrics: WorkerMetrics,
                 claim: Callable[[], None], wake: Callable[[], None]) -> None:
        self.store = store
        self.queue = queue
        self.settings = settings
        self.wakeup = wakeup
        self.upkeep = upkeep
        self.metrics = metrics
        self.claim = claim
        self.wake = wake
        self.size = FanoutSize(settings.batch_size)
        self.catching_up = False
        # Read at each scrape (WorkerMetrics.round_trips, .leased): the round trips of
        # the fan-outs, and the deliveries a quiet queue's fan-outs leased.
        self.round_trips = 0
        self.leased = 0
        self._backlog = asyncio.Event()
        # Since when the fan-outs found the lock held (loop time), and when the holder may
        # be looked at next.
        self._locked_out_since: float | None = None
        self._next_look = 0.0

    def due(self, now: float) -> bool:
        """Whether the loop fans out now: the wakeup says so, and no catch-up runs (the
        notifications that come meanwhile wait for it to end)."""
        return not self.catching_up and self.wakeup.fanout_due(now)

    def until_fanout(self, now: float) -> float:
        """Seconds until the loop looks at the outbox again: when it is due, or, while a
        catch-up runs, when that ends (it wakes the loop)."""
        if self.catching_up:
            return self.settings.poll_interval
        return max(self.wakeup.until_fanout(now), MIN_WAIT)

    async def fanned_out(self, batch: FanoutBatch, limit: int) -> None:
        """Counts what a fan-out of at most `limit` statements did, sizes the next one from
        it, and arms or disarms the wakeup as it asks."""
        if batch.locked:
            self.size.learn(batch.taken, batch.changes, batch.created)
        self.metrics.fanned_out.inc(batch.changes)
        now = asyncio.get_running_loop().time()
        self.upkeep.fanned_out(batch.created, now)
        if batch.locked:
            self._locked_out_since = None
            await self.wakeup.after_fanout(self.store, batch.taken, now, limit)
        else:
            await self._locked_out(now)

    async def _locked_out(self, now: float) -> None:
        """Another connection holds the fan-out's lock: after STUCK_FANOUT seconds of that,
        ends the holder if it waits for its client (a worker gone behind a proxy that keeps
        its connection open would otherwise stop every worker's fan-out for good)."""
        if self._locked_out_since is None:
            self._locked_out_since = now
        if now - self._locked_out_since < STUCK_FANOUT or now < self._next_look:
            return
        self._next_look = now + STUCK_FANOUT
        try:
            ended = await self.store.end_stuck_fanout(lock_key=FANOUT_LOCK, stuck=STUCK_FANOUT)
        except StoreError as exc:
            log.info("looking at the fan-out lock's holder failed: %s", exc)
            return
        if ended:
            log.warning("ended the backend that held the fan-out's lock for %.0fs waiting for"
                        " its client (a worker gone behind a connection left open)",
                        now - self._locked_out_since)

    async def fan_out(self, lease: ClaimParams, limit: int, *, quiet: bool
                      ) -> tuple[FanoutBatch, list[Claim]] | None:
        """One fan-out batch of at most `limit` statements and the claim of `lease`, in one
        round trip and one transaction: the deliveries a commit made go straight to the
        claim. On a `quiet` queue the fan-out leases what it makes, and no claim follows
        it. The batch and the claim's rows, or None when the batch failed on its data
        (then the catch-up's careful path runs, and the claim follows it)."""
        self.round_trips += 1
        try:
            if quiet:
                batch = await self.queue.fanout(FanoutBatch, fanout_params(
                    limit, self.settings.max_row_bytes, lease=lease))
                assert batch is not None
                rows = delivery.leased(batch.claims)
                self.leased += len(rows)
            else:
                batches, rows = await self.queue.fanout_and_claim(
                    FanoutBatch, Claim, fanout=fanout_params(limit, self.settings.max_row_bytes),
                    claim=lease)
                (batch,) = batches
        except StoreRejected as exc:
            if exc.data_error:
                return None
            self.wakeup.fanout_failed()
            raise
        except BaseException:
            self.wakeup.fanout_failed()
            raise
        return batch, rows

    def catch_up(self) -> None:
        """Has the backlog fanned out beside the loop (run), unless that runs already."""
        if not self.catching_up:
            self.catching_up = True
            self._backlog.set()

    async def run(self) -> None:
        """Fans out each backlog the loop hands over (catch_up); until cancelled."""
        while True:
            await self._backlog.wait()
            self._backlog.clear()
            try:
                await self._catch_up()
            finally:
                self.catching_up = False
                self.wake()

    async def _catch_up(self) -> None:
        """Fans out the outbox batch by batch until it is empty, on a queue connection of its
        own, while the loop claims and sends what each batch made: a backlog's fan-out no
        longer holds every claim of the worker until it ends. Each batch asks for a claim."""
        try:
            while True:
                limit = self.size.limit
                self.round_trips += 1
                batch = await fan_out_batch(self.queue, limit, self.settings.max_row_bytes)
                await self.fanned_out(batch, limit)
                self.claim()
                if not batch.locked or batch.taken < limit:
                    return
        except StoreError as exc:
            log.warning("fanning out the outbox's backlog failed, retrying: %s", exc)
            await self._retry_fanout()
        except Exception:
            log.exception("fanning out the outbox's backlog crashed; the loop tries again")
            await self._retry_fanout()

    async def _retry_fanout(self) -> None:
        """After a failed catch-up: the loop fans out again, after a pause (not at once, as
        the database may be refusing every statement)."""
        await asyncio.sleep(CATCH_UP_RETRY)
        self.wakeup.fanout_failed()
