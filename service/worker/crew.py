"""The worker's parts, made and tied together; Worker (loop.py) runs its loop over them.

The slots and the capacity they follow (slots.py, capacity.py), pacing (pacing.py), the
senders and the recorder (attempts.py, recorder.py), the listener and the wakeup
(listener.py, wakeup.py), the outbox's side (outbox.py), the claims (claims.py), the
upkeep (upkeep.py), and the supervised side tasks that run them. What the parts report
comes here (an attempt over, outcomes written, the capacity changed, a notification),
and each may make a claim due and wake the loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import time
from typing import Any

import psycopg

from service.config import Settings
from service.curl import CurlClient
from service.store import Store, StoreError
from service.worker import capacity, delivery
from service.worker.attempts import Attempts
from service.worker.backfill import backfill_loop
from service.worker.claims import Claims
from service.worker.delivery import Outcome
from service.worker.listener import Listener
from service.worker.metrics import WorkerMetrics
from service.worker.outbox import Outbox
from service.worker.pacing import Pacing
from service.worker.pruning import prune_loop
from service.worker.recorder import Recorder
from service.worker.slots import Slots
from service.worker.supervise import Supervisor
from service.worker.upkeep import Upkeep
from service.worker.wakeup import Wakeup

log = logging.getLogger("webhooks.worker")

# An attempt in flight this long (or a quarter of the delivery timeout, if less) marks its
# subscription slow: one attempt in flight at a time until one succeeds.
SLOW_AFTER = 1.0

_worker_numbers = itertools.count(1)


class Crew:
    """The parts of a worker delivering with the given store and HTTP session.

    The fan-out, the claims and the records run on `queue`, a store whose pool sets
    QUEUE_SETTINGS (open_worker); `store` serves the rest. A queue on a plain pool works
    the same, with plans as PostgreSQL picks them."""

    def __init__(self, settings: Settings, store: Store, session: CurlClient, *,
                 concurrency: int, metrics: WorkerMetrics | None = None,
                 queue: Store | None = None) -> None:
        self.settings = settings
        self.store = store
        self.queue = queue or store
        self.metrics = metrics or WorkerMetrics()
        # Names this worker in webhooks.worker_tasks (several may run in one process).
        self.name = f"{socket.gethostname()}:{os.getpid()}:{next(_worker_numbers)}"
        self.supervisor = Supervisor(store, self.name, self.metrics)
        self.slots = Slots(concurrency, per_target=settings.per_target_concurrency,
                           per_owner=settings.per_owner_concurrency,
                           batch_size=settings.batch_size,
                           slow_after=min(SLOW_AFTER, settings.delivery_timeout / 4))
        # The capacity in flight adapts to the machine (capacity.py); `concurrency` is
        # its ceiling.
        self.capacity = capacity.for_worker(concurrency, settings.memory_budget)
        self.slots.resize(self.capacity.limit)
        self.concurrency = self.capacity.ceiling
        self.pacing = Pacing(self.slots, lease=settings.lease, scan=settings.batch_size)
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._recorder = Recorder(self.queue, on_written=self._recorded)
        self.metrics.unwritten.set_function(lambda: self._recorder.backlog)
        self._attempts = Attempts(settings, session, self.slots, self._recorder,
                                  metrics=self.metrics, wake=self._slot_freed,
                                  stranded=self._wake.set)
        # Wall-clock times of the worker's start and of its last completed round (a step
        # of the loop that ended without an error): its progress, in metrics, `webhooks
        # status` (through the listener's proof) and the liveness check (liveness.py).
        self.started_at = time.time()
        self.last_round: float | None = None
        self.listener = Listener(
            settings.database_url, self.wake, check_interval=settings.listen_check_interval,
            timeout=settings.worker_db_timeout, tcp_timeout=settings.db_tcp_timeout,
            connect_timeout=settings.db_connect_timeout, report=self._progress,
            proved=self.metrics.listen_proof.set, opened=self.metrics.listen_connections.inc)
        self.wakeup = Wakeup(self.listener, batch_size=settings.batch_size,
                             poll_interval=settings.poll_interval)
        self.upkeep = Upkeep(store, settings, pacing=self.pacing, metrics=self.metrics,
                             claim=self._claim)
        self.outbox = Outbox(store, self.queue, settings, wakeup=self.wakeup,
                             upkeep=self.upkeep, metrics=self.metrics,
                             claim=self._claim, wake=self._wake.set)
        self.claims = Claims(store, self.queue, settings, slots=self.slots,
                             pacing=self.pacing, upkeep=self.upkeep, metrics=self.metrics)
        # Counted per round trip or fan-out as plain ints, read at each scrape.
        self.metrics.round_trips.read = lambda: (
            self.claims.round_trips + self.outbox.round_trips + self.upkeep.round_trips)
        self.metrics.leased.read = lambda: self.outbox.leased

    def _progress(self) -> dict[str, Any]:
        """What the listener's proof reports (`webhooks status`)."""
        return {"worker": self.name, "round": self.last_round, "started": self.started_at}

    async def prepare_queue(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Prepares the queue's statements on a new queue connection (Claims.prepare)."""
        await self.claims.prepare(conn)

    def wake(self) -> None:
        """Makes the loop look for work (outbox included) now."""
        self.wakeup.notified()
        self._claim()

    def _claim(self) -> None:
        """Something may have made deliveries claimable (a notification, a fan-out, a
        lifecycle round): the loop claims at its next step."""
        self.pacing.ask()
        self._wake.set()

    def _slot_freed(self) -> None:
        """An attempt is over: the loop wakes when pacing says a claim is due."""
        if self.pacing.slot_freed():
            self._wake.set()

    def _capacity_changed(self, limit: int, bound: str) -> None:
        """The capacity's tick: slots, senders and metrics follow it; more room asks for
        a claim."""
        if limit != self.slots.concurrency:
            grown = limit > self.slots.concurrency
            self.slots.resize(limit)
            self._attempts.resized()
            if grown:
                self._claim()
        self.metrics.capacity_changed(self.capacity)

    def _recorded(self, outcomes: list[Outcome]) -> None:
        """Outcomes are written: retries come due from now on, at the earliest in the
        shortest of their delays."""
        self.upkeep.recorded(len(outcomes))
        delays = [o.retry_in for o in outcomes if o.outcome == "pending"]
        if delays:
            self.pacing.retry_due(asyncio.get_running_loop().time() + max(min(delays), 0.0))
            self._wake.set()

    def _start_side_tasks(self) -> tuple[list[asyncio.Task[None]], asyncio.Task[None]]:
        """Starts the supervised side tasks: those cancelled at shutdown, and the
        recorder, which shutdown lets finish (_drain)."""
        settings = self.settings
        helpers = [
            self.supervisor.start("listener", self.listener.run),
            self.supervisor.start("pruner", lambda: prune_loop(
                self.store.with_timeout(settings.maintenance_db_timeout),
                settings.retention)),
            self.supervisor.start("backfill", lambda: backfill_loop(
                self.store.with_timeout(settings.backfill_db_timeout), settings,
                self.wake)),
            self.supervisor.start("lifecycle", self.upkeep.lifecycle),
            self.supervisor.start("maintenance", self.upkeep.maintenance),
            self.supervisor.start("backlog", self.outbox.run),
        ]
        recorder = self.supervisor.start("recorder", self._recorder.run)
        helpers.append(self.supervisor.start("capacity", capacity.CapacityLoop(
            self.capacity, self.slots.take_peak, self._capacity_changed).run))
        self.metrics.capacity_changed(self.capacity, lambda: self.slots.sending_total)
        return helpers, recorder

    async def _drain(self, recorder: asyncio.Task[None]) -> int:
        """Finishes the attempts under way within the grace period, writes their outcomes
        and gives back the claims left; returns how many it gave back."""
        await self._attempts.finish(self.settings.shutdown_grace)
        self._recorder.close()
        await recorder
        leftover = self.slots.leftover()
        try:
            await delivery.release(self.store, leftover)
        except StoreError as exc:
            log.warning("could not release %d claims; their leases will: %s",
                        len(leftover), exc)
            return 0
        self.metrics.released.inc(len(leftover))
        return len(leftover)
