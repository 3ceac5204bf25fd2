"""The delivery worker: wake on NOTIFY or poll, fan out the outbox, claim and deliver.

One loop per process does the database work (fan-out, claims); claimed deliveries wait in
the slots until they may be sent, and a fixed set of sender tasks sends them
(attempts.py), so the next claim is under way while the last one's deliveries are sent. A
Recorder writes finished attempts in batches.
Shutdown stops claiming, lets in-flight attempts finish within the grace period and gives
the rest back. The parts: wakeup.py (when to look at the outbox), pacing.py (when to
claim, and how much), slots.py (who holds the slots), supervise.py (side tasks that
crash), pruning.py (retention).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import signal
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from service.availability import wait_for_database, wait_until_migrated
from service.config import Settings
from service.curl import CurlClient
from service.store import QUEUE_SETTINGS, Session, Store, StoreError, StoreRejected, make_pool
from service.worker import capacity, delivery, tracing
from service.worker.attempts import Attempts
from service.worker.backfill import backfill_loop
from service.worker.delivery import Claim, Outcome
from service.worker.fanout import (
    PREPARE_LOCK,
    FanoutBatch,
    FanoutSize,
    fan_out_batch,
    fanout_params,
)
from service.worker.lifecycle import interval as lifecycle_interval
from service.worker.lifecycle import run_round as lifecycle_round
from service.worker.listener import Listener
from service.worker.liveness import Liveness
from service.worker.metrics import WorkerMetrics, WorkerStats
from service.worker.pacing import LANE_STEPS, LANE_TAKE, MIN_WAIT, Pacing, claim_params
from service.worker.pruning import prune_loop
from service.worker.recorder import Recorder
from service.worker.slots import Slots
from service.worker.supervise import RESTART_MAX, Supervisor, cancel_all
from service.worker.wakeup import Step, Wakeup

log = logging.getLogger("webhooks.worker")

# An attempt in flight this long (or a quarter of the delivery timeout, if less) marks its
# subscription slow: one attempt in flight at a time until one succeeds.
SLOW_AFTER = 1.0

# Deliveries made by fan-out after which the partitions being filled are analysed (at
# most every ANALYZE_EVERY seconds): a burst outruns autovacuum's minute.
ANALYZE_AFTER = 10_000
ANALYZE_EVERY = 10.0

# Seconds before the loop fans out again after a backlog's fan-out failed.
CATCH_UP_RETRY = 0.5

# Attempts recorded after which, once a claim (or a quiet queue's leasing fan-out) finds
# the queue drained, the deliveries partitions being filled are vacuumed. Each delivery
# leaves entries in the queue's due index (its fan-out's and its claim's) that no longer
# lead to a due delivery, which every claim and every quiet fan-out's probe walks past
# until a vacuum (autovacuum comes a minute or more later): right after a 20,000-delivery
# backlog a fresh change's fan-out took 7-9 ms, 1 ms once vacuumed.
VACUUM_AFTER = 10_000
# Deliveries of inactive subscriptions closed per statement (Worker._close_inactive).
CLOSE_BATCH = 5_000

_worker_numbers = itertools.count(1)


class Worker:
    """Delivers webhooks with the given store and HTTP session until stop() is called.

    The fan-out, the claims and the records run on `queue`, a store whose pool sets
    QUEUE_SETTINGS (open_worker); `store` serves the rest. A queue on a plain pool works
    the same, with plans as PostgreSQL picks them."""

    def __init__(self, settings: Settings, store: Store, session: CurlClient, *,
                 concurrency: int, metrics: WorkerMetrics | None = None,
                 queue: Store | None = None) -> None:
        self.settings = settings
        self.store = store
        self.queue = queue or store
        self.stats = WorkerStats()
        self.metrics = metrics or WorkerMetrics()
        # Names this worker in webhooks.worker_tasks (several may run in one process).
        self.name = f"{socket.gethostname()}:{os.getpid()}:{next(_worker_numbers)}"
        self.supervisor = Supervisor(store, self.name, self.metrics)
        self.task_restarts = self.supervisor.restarts
        self.slots = Slots(concurrency, per_target=settings.per_target_concurrency,
                           per_owner=settings.per_owner_concurrency,
                           batch_size=settings.batch_size,
                           slow_after=min(SLOW_AFTER, settings.delivery_timeout / 4))
        # The capacity in flight adapts to the machine (capacity.py); `concurrency` is
        # its ceiling.
        self.capacity = capacity.for_worker(concurrency, settings.memory_budget)
        self.slots.resize(self.capacity.limit)
        self.concurrency, self.per_owner = self.capacity.ceiling, self.slots.per_owner
        self.pacing = Pacing(self.slots, lease=settings.lease, scan=settings.batch_size)
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._recorder = Recorder(self.queue, on_written=self._recorded)
        self._attempts = Attempts(settings, session, self.slots, self._recorder,
                                  stats=self.stats, metrics=self.metrics, wake=self._slot_freed,
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
            proved=self.metrics.listen_proof.set)
        self.wakeup = Wakeup(self.listener, batch_size=settings.batch_size,
                             poll_interval=settings.poll_interval)
        self.fanout_size = FanoutSize(settings.batch_size)
        self._main: asyncio.Task[None] | None = None
        # Loop time of the next failure-lifecycle round (lifecycle.py).
        self._lifecycle_at = 0.0
        self._unanalysed = 0  # deliveries fanned out since the last ANALYZE
        self._analyzed_at = float("-inf")
        self._analyzing: asyncio.Task[None] | None = None
        self._unvacuumed = 0  # attempts recorded since the last VACUUM
        self._vacuuming: asyncio.Task[None] | None = None
        # Fans out a backlog of the outbox beside the loop, which claims meanwhile.
        self._catching_up: asyncio.Task[None] | None = None

    @property
    def pool(self) -> AsyncConnectionPool:
        """The worker's connection pool."""
        return self.store.pool

    def _progress(self) -> dict[str, Any]:
        """What the listener's proof reports (`webhooks status`)."""
        return {"worker": self.name, "round": self.last_round, "started": self.started_at}

    def _round_done(self) -> None:
        self.last_round = time.time()
        self.metrics.last_round.set(self.last_round)

    async def prepare_queue(self, conn: psycopg.AsyncConnection[Any]) -> None:
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

    def start(self) -> None:
        """Starts the worker in the running loop."""
        self._main = asyncio.create_task(self.run(), name="webhooks-worker")

    async def stop(self) -> None:
        """Stops claiming, finishes or releases what is in flight, and waits for that."""
        self._stopping.set()
        self._wake.set()
        if self._main is not None:
            await self._main

    def wake(self) -> None:
        """Makes the loop look for work (outbox included) now."""
        self.wakeup.notified()
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
                self.pacing.ask()
                self._wake.set()
        self.metrics.capacity_changed(self.capacity)

    def _recorded(self, outcomes: list[Outcome]) -> None:
        """Outcomes are written: retries come due from now on, at the earliest in the
        shortest of their delays."""
        self._unvacuumed += len(outcomes)
        delays = [o.retry_in for o in outcomes if o.outcome == "pending"]
        if delays:
            self.pacing.retry_due(asyncio.get_running_loop().time() + max(min(delays), 0.0))
            self._wake.set()

    async def run(self) -> None:
        """Runs until stop(); then drains as described in the module docstring."""
        if self.settings.lease <= self.settings.delivery_timeout:
            log.warning("WEBHOOKS_LEASE (%gs) should exceed WEBHOOKS_DELIVERY_TIMEOUT (%gs), "
                        "or slow attempts may be sent twice at once",
                        self.settings.lease, self.settings.delivery_timeout)
        helpers = [
            self.supervisor.start("listener", self.listener.run),
            self.supervisor.start("pruner", lambda: prune_loop(
                self.store.with_timeout(self.settings.maintenance_db_timeout),
                self.settings.retention)),
            self.supervisor.start("backfill", lambda: backfill_loop(
                self.store.with_timeout(self.settings.backfill_db_timeout), self.settings,
                self.wake)),
        ]
        recorder = self.supervisor.start("recorder", self._recorder.run)
        helpers.append(self.supervisor.start("capacity", capacity.CapacityLoop(
            self.capacity, self.slots.take_peak, self._capacity_changed).run))
        self.metrics.capacity_changed(self.capacity, lambda: self.slots.sending_total)
        log.info("worker started", extra={
            "concurrency": self.concurrency, "capacity": self.capacity.limit,
            "memory_budget_mb": self.settings.memory_budget >> 20})
        try:
            await self._loop()
        finally:
            if self._analyzing is not None:
                helpers.append(self._analyzing)
            if self._vacuuming is not None:
                helpers.append(self._vacuuming)
            if self._catching_up is not None:
                helpers.append(self._catching_up)
            await cancel_all(helpers)
            await self._drain(recorder)
            await self.wakeup.disarm(self.store)
            log.info("worker stopped", extra={"released": self.stats.released})

    async def _loop(self) -> None:
        backoff = 0.1
        self._wake.set()  # catch up with whatever is already waiting
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                wait = await self._step()
            except StoreError as exc:
                # Postgres restarting, a network blip: the tables still hold all the work.
                self.stats.db_errors += 1
                log.warning("database error in worker loop, retrying: %s", exc)
                await self._pause(backoff * random.uniform(0.5, 1.5))
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception as exc:
                # A bug: the loop is the worker, so it is restarted in place, like a task.
                await self._pause(await self.supervisor.crashed("loop", exc, backoff))
                backoff = min(backoff * 2, RESTART_MAX)
                continue
            backoff = 0.1
            self._round_done()
            until_lifecycle = self._lifecycle_at - asyncio.get_running_loop().time()
            await self._wait(min(wait, until_lifecycle))

    async def _pause(self, seconds: float) -> None:
        """Sleeps `seconds`, or less if the worker is stopped meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _step(self) -> float:
        """Fans out if due, claims what the slots allow; returns how long to wait.

        While a backlog is being fanned out beside the loop (_catch_up), the loop only
        claims: the notifications that come meanwhile wait for the catch-up to end."""
        loop = asyncio.get_running_loop()
        if self._catching_up is None and self.wakeup.fanout_due(loop.time()):
            wait = await self._fan_out_and_claim()
            if wait is not None:
                return wait
            # No free slot, or the batch failed on its data: fanned out beside the loop
            # (carefully, when it must be).
            self._start_catch_up()
            # Whatever made the outbox due (a commit, an API action's NOTIFY, the poll
            # interval) may have made deliveries due too.
            self.pacing.ask()
        if loop.time() >= self._lifecycle_at:
            self._lifecycle_at = loop.time() + lifecycle_interval(self.settings)
            await lifecycle_round(self.store, self.settings, self.metrics)
            await self._refresh_floor()
            self.pacing.ask()
        now = loop.time()
        self.slots.mark_slow(now)
        await self._give_back_stranded()
        until_fanout = self._until_fanout(now)
        idle = self.pacing.idle(now)
        if idle is not None:
            return min(idle, until_fanout)
        wanted = self.slots.wanted()
        if wanted == 0:
            # Finishing attempts wake us; then claim.
            self.pacing.ask()
            return self.settings.poll_interval
        await self._others(now)
        self.stats.round_trips += 1
        rows = await self.queue.claim(Claim, self.pacing.claim_params(wanted))
        claims = delivery.in_start_order(rows)
        self._attempts.start(claims)
        await self._close_inactive(rows)
        return await self._paced(claims, wanted, now, until_fanout)

    async def _refresh_floor(self) -> None:
        """Raises the queue's floor to what is pending now, for the claims and fan-outs
        after it (refresh_queue_floor in sql/partitions.sql). A refresh the database
        refuses leaves the floor the worker has: a stale one costs only reading older
        partitions, or, when it was lowered since, an empty claim and next_due's."""
        self.stats.round_trips += 1
        try:
            self.pacing.since = await self.store.refresh_queue_floor()
        except StoreRejected as exc:
            log.warning("could not refresh the queue's floor: %s", exc)

    async def _others(self, now: float) -> None:
        """Looks for other queues with due deliveries, for the claims to take from beside
        the oldest, when the lane is due (Pacing.lane_due, Lane; others_due in
        sql/queries/worker.sql)."""
        if not self.pacing.lane_due(now):
            return
        self.stats.round_trips += 1
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

    async def _close_inactive(self, rows: list[Claim]) -> None:
        """Closes, batch after batch, the rest of the due queue of the subscriptions the
        claim found inactive (it closes what it meets of them within its caps, oldest
        first): a large queue of a subscription made inactive never stands before every
        other subscription's (close_inactive in sql/queries/worker.sql)."""
        ids = delivery.inactive(rows)
        while ids:
            self.stats.round_trips += 1
            closed = await self.queue.close_inactive(subscription_ids=ids, limit=CLOSE_BATCH)
            self.stats.closed_inactive += closed
            if closed < CLOSE_BATCH:
                return

    async def _paced(self, claims: list[Claim], wanted: int, now: float,
                     until_fanout: float) -> float:
        """How long to wait after a claim that asked for `wanted` (its attempts started),
        asking when the next delivery is due when the claim found nothing."""
        wait = self.pacing.claimed(claims, wanted, now)
        if self.pacing.drained:
            self._vacuum_if_drained()
        if wait is None:
            self.stats.round_trips += 1
            due, self.pacing.since = await self.store.next_due(
                saturated=self.slots.saturated(), saturated_owners=self.slots.saturated_owners())
            wait = self.pacing.next_due(due, now)
        return min(wait, until_fanout)

    async def _give_back_stranded(self) -> None:
        """Gives back the waiting claims of subscriptions that became degraded."""
        stranded = self.slots.stranded()
        if stranded:
            self.stats.round_trips += 1
            await delivery.release(self.store, stranded)
            self.pacing.ask()

    async def _fan_out_and_claim(self) -> float | None:
        """One fan-out batch and the claim of what is due, in one round trip and one
        transaction: the deliveries a commit made go straight to the claim. Returns how
        long to wait, or None when this does not apply (no free slot, or the batch failed
        on its data: then _fan_out's careful path runs and the claim follows it)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.slots.mark_slow(now)
        wanted = self.slots.wanted()
        if wanted == 0:
            return None
        # A quiet queue: the fan-out leases what it makes, and no claim follows it.
        quiet = self.pacing.quiet(now)
        if not quiet:
            await self._others(now)
        self.stats.round_trips += 1
        limit = self.fanout_size.limit
        claim = self.pacing.claim_params(wanted)
        started = time.time_ns()
        try:
            if quiet:
                batch = await self.queue.fanout(FanoutBatch, fanout_params(
                    limit, self.settings.max_row_bytes, lease=claim))
                assert batch is not None
                rows = delivery.leased(batch.claims)
                self.stats.leased += len(rows)
            else:
                batches, rows = await self.queue.fanout_and_claim(
                    FanoutBatch, Claim, fanout=fanout_params(limit, self.settings.max_row_bytes),
                    claim=claim)
                (batch,) = batches
        except StoreRejected as exc:
            if exc.data_error:
                return None
            self.wakeup.fanout_failed()
            raise
        except BaseException:
            self.wakeup.fanout_failed()
            raise
        # The claims are this worker's from the commit on: sent whatever the bookkeeping
        # below meets (arming the wakeup row may fail on another connection, and the
        # claims would then wait out their lease).
        claims = delivery.in_start_order(rows)
        self._attempts.start(claims)
        tracing.tracer().fanout(started, batch.taken, batch.changes, batch.created)
        # The senders go first (a fresh change's POST is the latency that counts); the
        # bookkeeping below waits one turn of the loop.
        await asyncio.sleep(0)
        await self._close_inactive(rows)
        await self._fanned_out(batch.taken, batch.changes, batch.created, batch.locked, limit)
        if batch.locked and batch.taken >= limit:
            self._start_catch_up()  # a backlog: fanned out beside the loop's claims
        if quiet and not (batch.locked and batch.quiet and batch.created == len(claims)):
            # Something was due after all, caps held some of the batch back, or another
            # worker fanned out: the claim runs at the next step, and a fan-out that a
            # notification brings first claims beside it (Pacing.not_quiet).
            self.pacing.not_quiet()
            return 0.0
        now = loop.time()
        return await self._paced(claims, wanted, now, self._until_fanout(now))

    def _until_fanout(self, now: float) -> float:
        """Seconds until the loop looks at the outbox again: when it is due, or, while a
        catch-up runs, when that ends (it wakes the loop)."""
        if self._catching_up is not None:
            return self.settings.poll_interval
        return max(self.wakeup.until_fanout(now), MIN_WAIT)

    def _start_catch_up(self) -> None:
        if self._catching_up is None and not self._stopping.is_set():
            self._catching_up = asyncio.create_task(self._catch_up(),
                                                    name="webhooks-fanout-backlog")

    async def _catch_up(self) -> None:
        """Fans out the outbox batch by batch until it is empty, on a queue connection of its
        own, while the loop claims and sends what each batch made: a backlog's fan-out no longer
        holds every claim of the worker until it ends. Each batch wakes the loop."""
        try:
            while not self._stopping.is_set():
                limit = self.fanout_size.limit
                self.stats.round_trips += 1
                batch = await fan_out_batch(self.queue, limit, self.settings.max_row_bytes)
                await self._fanned_out(batch.taken, batch.changes, batch.created,
                                       batch.locked, limit)
                self.pacing.ask()
                self._wake.set()
                if not batch.locked or batch.taken < limit:
                    return
        except StoreError as exc:
            log.warning("fanning out the outbox's backlog failed, retrying: %s", exc)
            await self._retry_fanout()
        except Exception:
            log.exception("fanning out the outbox's backlog crashed; the loop tries again")
            await self._retry_fanout()
        finally:
            self._catching_up = None
            self._wake.set()

    async def _retry_fanout(self) -> None:
        """After a failed catch-up: the loop fans out again, after a pause (not at once, as
        the database may be refusing every statement)."""
        await self._pause(CATCH_UP_RETRY)
        self.wakeup.fanout_failed()

    async def _fanned_out(self, taken: int, changes: int, created: int, locked: bool,
                          limit: int) -> None:
        """Counts what a fan-out of at most `limit` statements a batch did, sizes the next
        one from it, and arms or disarms the wakeup as it asks."""
        if locked:
            self.fanout_size.learn(taken, changes, created)
        self.stats.fanned_out += created
        self.metrics.fanned_out.inc(changes)
        self._unanalysed += created
        now = asyncio.get_running_loop().time()
        if (self._unanalysed >= ANALYZE_AFTER and now - self._analyzed_at >= ANALYZE_EVERY
                and (self._analyzing is None or self._analyzing.done())):
            self._unanalysed, self._analyzed_at = 0, now
            self._analyzing = asyncio.create_task(self._maintain(vacuum=False),
                                                  name="webhooks-analyze")
        if locked and await self.wakeup.after_fanout(self.store, taken, now,
                                                     limit) is Step.DISARM:
            self.stats.disarmed += 1

    def _vacuum_if_drained(self) -> None:
        """A claim, or a leasing fan-out, found everything claimable (Pacing.drained), empty
        or not: after a backlog, the partitions being filled are vacuumed beside the loop.
        Waiting for a claim that came back empty left them unvacuumed for as long as a
        steady load lasted (each change leased by its fan-out, no claim coming back
        empty)."""
        if self._unvacuumed >= VACUUM_AFTER and (self._vacuuming is None
                                                 or self._vacuuming.done()):
            self._unvacuumed = 0
            self._vacuuming = asyncio.create_task(self._maintain(vacuum=True),
                                                  name="webhooks-vacuum")

    async def _maintain(self, *, vacuum: bool) -> None:
        """Analyses (after a burst) or vacuums (after a drained backlog) the deliveries
        partitions being filled, one at a time."""
        try:
            store = self.store.with_timeout(self.settings.maintenance_db_timeout)
            async with store.session() as s:
                for partition in await s.current_partitions():
                    await s.maintain_partition(partition=partition, vacuum=vacuum)
        except StoreError as exc:
            log.warning("could not %s the queue: %s", "vacuum" if vacuum else "analyse", exc)

    async def _wait(self, timeout: float) -> None:
        if timeout <= 0 or self._stopping.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _drain(self, recorder: asyncio.Task[None]) -> None:
        await self._attempts.finish(self.settings.shutdown_grace)
        self._recorder.close()
        await recorder
        leftover = self.slots.leftover()
        try:
            await delivery.release(self.store, leftover)
            self.stats.released += len(leftover)
        except StoreError as exc:
            log.warning("could not release %d claims; their leases will: %s",
                        len(leftover), exc)


@contextlib.asynccontextmanager
async def open_worker(settings: Settings, *, concurrency: int,
                      metrics: WorkerMetrics | None = None) -> AsyncIterator[Worker]:
    """A started Worker with its own pools and HTTP session, all closed on exit."""
    tcp, connect = settings.db_tcp_timeout, settings.db_connect_timeout
    pool = make_pool(settings.database_url, min_size=2, max_size=max(2, settings.pool_size),
                     name="worker", tcp_timeout=tcp, connect_timeout=connect)
    # The loop's fan-out and claim, the recorder, and the fan-out of a backlog beside the
    # loop: one statement each at a time, each prepared on every connection as it opens
    # (Worker.prepare_queue).
    async def prepare(conn: psycopg.AsyncConnection[Any]) -> None:
        await worker.prepare_queue(conn)  # made below, before the pool opens

    queue = make_pool(settings.database_url, min_size=2, max_size=3, name="worker-queue",
                      settings=QUEUE_SETTINGS, prepare_threshold=0, configure=prepare,
                      tcp_timeout=tcp, connect_timeout=connect)
    async with contextlib.AsyncExitStack() as stack:
        session = CurlClient(allow_private=settings.allow_private_targets,
                             max_connections=capacity.connections(concurrency),
                             dns_timeout=settings.dns_timeout,
                             dns_servers=settings.dns_servers,
                             connect_timeout=settings.delivery_timeout,
                             body_limit=delivery.BODY_LIMIT, ca_bundle=settings.ca_bundle,
                             proxy=settings.delivery_proxy)
        stack.push_async_callback(session.close)
        # Each checkout and statement of the loop, the recorder and the fan-out ends within
        # WEBHOOKS_WORKER_DB_TIMEOUT (retention's, the vacuum's and the backfills' have
        # theirs: Worker.run).
        worker = Worker(settings, Store(pool, settings.worker_db_timeout), session,
                        concurrency=concurrency, metrics=metrics,
                        queue=Store(queue, settings.worker_db_timeout))
        await pool.open(wait=True)
        stack.push_async_callback(pool.close)
        await queue.open(wait=True)
        stack.push_async_callback(queue.close)
        worker.start()
        try:
            yield worker
        finally:
            await worker.stop()


async def run_worker(settings: Settings, *, concurrency: int, metrics_port: int | None = None,
                     metrics_host: str = "127.0.0.1", stop: asyncio.Event | None = None,
                     metrics: WorkerMetrics | None = None,
                     liveness: Liveness | None = None) -> None:
    """Delivers until SIGTERM/SIGINT (or `stop` is set), then shuts down cleanly. Its
    metrics and its liveness check (/livez) are served on `metrics_port`, or kept up to
    date in `metrics` and `liveness` for another server to show (`webhooks run`: the
    API's /metrics and /livez)."""
    liveness = liveness or Liveness(settings)
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        if not await wait_for_database(settings.database_url, stop):
            return
        # A database not migrated yet: one line saying so, then a quiet wait for it.
        if not await wait_until_migrated(settings.database_url, stop):
            return
        async with open_worker(settings, concurrency=concurrency, metrics=metrics) as worker:
            liveness.watch(worker)
            refresher = None
            if metrics_port is not None:
                worker.metrics.serve(metrics_port, metrics_host, liveness=liveness.check)
                log.info("metrics on http://%s:%d/metrics, liveness on /livez", metrics_host,
                         metrics_port)
            if metrics_port is not None or metrics is not None:
                refresher = asyncio.create_task(worker.metrics.refresh_loop(worker.store))
            await stop.wait()
            if refresher is not None:
                refresher.cancel()
            log.info("stopping: finishing in-flight deliveries",
                     extra={"grace": settings.shutdown_grace})
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
