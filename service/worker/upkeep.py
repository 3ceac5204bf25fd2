"""The worker's upkeep, beside its loop as supervised side tasks: the failure lifecycle's
round with the queue floor's refresh every few seconds ("lifecycle"), and the deliveries
partitions being filled analysed after a burst of fan-out or vacuumed after a drained
backlog ("maintenance"). The loop only tells Upkeep what it did; neither task holds up
a claim."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from service.config import Settings
from service.store import Store, StoreError, StoreRejected
from service.worker.lifecycle import interval as lifecycle_interval
from service.worker.lifecycle import run_round as lifecycle_round
from service.worker.metrics import WorkerMetrics
from service.worker.pacing import Pacing

log = logging.getLogger("webhooks.worker")

# Deliveries made by fan-out after which the partitions being filled are analysed (at
# most every ANALYZE_EVERY seconds): a burst outruns autovacuum's minute.
ANALYZE_AFTER = 10_000
ANALYZE_EVERY = 10.0

# Attempts recorded after which, once a claim (or a quiet queue's leasing fan-out) finds
# the queue drained, the deliveries partitions being filled are vacuumed. Each delivery
# leaves entries in the queue's due index (its fan-out's and its claim's) that no longer
# lead to a due delivery, which every claim and every quiet fan-out's probe walks past
# until a vacuum (autovacuum comes a minute or more later): right after a 20,000-delivery
# backlog a fresh change's fan-out took 7-9 ms, 1 ms once vacuumed.
VACUUM_AFTER = 10_000


class Upkeep:
    """Counts what the loop reports and runs the upkeep it calls for. `claim` is told
    when a lifecycle round may have made deliveries claimable."""

    def __init__(self, store: Store, settings: Settings, *, pacing: Pacing,
                 metrics: WorkerMetrics,
                 claim: Callable[[], None]) -> None:
        self.store = store
        self.settings = settings
        self.pacing = pacing
        self.metrics = metrics
        self.claim = claim
        self.round_trips = 0  # the queue floor's refreshes (Claims.round_trips)
        self.unanalysed = 0  # deliveries fanned out since the last ANALYZE
        self.analyzed_at = float("-inf")
        self.unvacuumed = 0  # attempts recorded since the last VACUUM
        # The maintenance asked for and not yet begun, and the one under way: None,
        # "analyse" or "vacuum".
        self.wanted: str | None = None
        self.running: str | None = None
        self._asked = asyncio.Event()

    def fanned_out(self, created: int, now: float) -> None:
        """A fan-out made `created` deliveries (at loop time `now`): after a burst, the
        partitions being filled are analysed."""
        self.unanalysed += created
        if (self.unanalysed >= ANALYZE_AFTER and now - self.analyzed_at >= ANALYZE_EVERY
                and self.wanted is None and self.running != "analyse"):
            self.unanalysed, self.analyzed_at = 0, now
            self._ask("analyse")

    def recorded(self, attempts: int) -> None:
        """`attempts` outcomes were written."""
        self.unvacuumed += attempts

    def drained(self) -> None:
        """A claim, or a leasing fan-out, found everything claimable (Pacing.drained), empty
        or not: after a backlog, the partitions being filled are vacuumed. Waiting for a
        claim that came back empty left them unvacuumed for as long as a steady load lasted
        (each change leased by its fan-out, no claim coming back empty)."""
        if (self.unvacuumed >= VACUUM_AFTER and self.wanted != "vacuum"
                and self.running != "vacuum"):
            self.unvacuumed = 0
            self._ask("vacuum")

    def _ask(self, what: str) -> None:
        # A VACUUM asked for takes the place of an ANALYZE not begun: it analyses too.
        self.wanted = what
        self._asked.set()

    async def maintenance(self) -> None:
        """Runs each ANALYZE or VACUUM asked for, one at a time; until cancelled."""
        store = self.store.with_timeout(self.settings.maintenance_db_timeout)
        while True:
            await self._asked.wait()
            self._asked.clear()
            what, self.wanted = self.wanted, None
            if what is None:
                continue
            self.running = what
            try:
                await maintain(store, vacuum=what == "vacuum")
            finally:
                self.running = None

    async def lifecycle(self) -> None:
        """A failure-lifecycle round (lifecycle.py) and the queue floor's refresh every
        lifecycle interval, from the worker's start; each asks for a claim, as a round
        may have queued deliveries or unparked a strict subscription's next one."""
        while True:
            try:
                await lifecycle_round(self.store, self.settings, self.metrics)
                await self._refresh_floor()
                self.claim()
            except StoreError as exc:
                # The database restarting, a timeout: the next round comes as usual.
                self.metrics.db_errors.inc()
                log.warning("the failure lifecycle's round failed, retrying: %s", exc)
            await asyncio.sleep(lifecycle_interval(self.settings))

    async def _refresh_floor(self) -> None:
        """Raises the queue's floor to what is pending now, for the claims and fan-outs
        after it (refresh_queue_floor in sql/partitions.sql). A refresh the database
        refuses leaves the floor the worker has: a stale one costs only reading older
        partitions, or, when it was lowered since, an empty claim and next_due's."""
        self.round_trips += 1
        try:
            self.pacing.since = await self.store.refresh_queue_floor()
        except StoreRejected as exc:
            log.warning("could not refresh the queue's floor: %s", exc)


async def maintain(store: Store, *, vacuum: bool) -> None:
    """Analyses (after a burst) or vacuums (after a drained backlog) the deliveries
    partitions being filled, one at a time."""
    try:
        async with store.session() as s:
            for partition in await s.current_partitions():
                await s.maintain_partition(partition=partition, vacuum=vacuum)
    except StoreError as exc:
        log.warning("could not %s the queue: %s", "vacuum" if vacuum else "analyse", exc)
