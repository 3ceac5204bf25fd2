"""The delivery worker: wake on NOTIFY or poll, fan out the outbox, claim and deliver.

One loop per process does the database work (fan-out, claims); each claimed delivery is
sent by its own task, and a Recorder writes finished attempts in batches. Shutdown stops
claiming, lets in-flight attempts finish within the grace period and gives the rest back.
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
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
import psycopg
from psycopg_pool import AsyncConnectionPool

from service.config import Settings
from service.crypto import SecretBox, SecretsError
from service.db import make_pool, query
from service.http import make_session
from service.logs import redact
from service.worker import delivery
from service.worker.delivery import Claim, Recorder, pg_text
from service.worker.fanout import drain_outbox
from service.worker.listener import Listener
from service.worker.metrics import WorkerMetrics

log = logging.getLogger("webhooks.worker")

# Retention runs this often; each statement removes at most PRUNE_BATCH rows.
PRUNE_EVERY = 60.0
PRUNE_BATCH = 1000
# Shortest sleep when work is due but could not be claimed (locked by another worker).
MIN_WAIT = 0.01
# An attempt in flight this long (or a quarter of the delivery timeout, if less) marks its
# subscription slow: one attempt in flight at a time until one succeeds.
SLOW_AFTER = 1.0
# First recheck of the outbox after arming the wakeup row.
RECHECK_MIN = 0.05
# Plain secrets kept in memory at most, keyed by their stored (maybe encrypted) form.
SECRET_CACHE = 10_000
# A crashed background task is restarted after RESTART_MIN seconds, doubling (with jitter)
# up to RESTART_MAX while it keeps crashing; one that ran RESTART_RESET seconds since its
# last restart starts over from RESTART_MIN.
RESTART_MIN = 0.1
RESTART_MAX = 30.0
RESTART_RESET = 60.0
# Longest wait for writing a crash to webhooks.worker_tasks.
HEALTH_WRITE_TIMEOUT = 2.0

_worker_numbers = itertools.count(1)


@dataclass
class WorkerStats:
    """Counters of one worker, for logs, tests and (later) metrics."""

    fanned_out: int = 0
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    db_errors: int = 0
    disarmed: int = 0  # times a backlog made the worker stop asking for NOTIFY


class Worker:
    """Delivers webhooks with the given pool and HTTP session until stop() is called."""

    def __init__(self, settings: Settings, pool: AsyncConnectionPool,
                 session: aiohttp.ClientSession, *, concurrency: int) -> None:
        self.settings = settings
        self.concurrency = max(1, concurrency)
        # One owner (all its subscriptions) never holds more of this worker's slots.
        self.per_owner = settings.per_owner_concurrency or max(1, self.concurrency // 2)
        self._claim_min = max(1, min(settings.batch_size, self.concurrency // 4))
        self.stats = WorkerStats()
        self.metrics = WorkerMetrics()
        # Names this worker in webhooks.worker_tasks (several may run in one process).
        self.name = f"{socket.gethostname()}:{os.getpid()}:{next(_worker_numbers)}"
        self.task_restarts: dict[str, int] = {}
        self._pool = pool
        self._session = session
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        # Claimed, outcome not yet handed over: delivery id -> (claim, when it started).
        self._inflight: dict[int, tuple[Claim, float]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._per_sub: dict[int, int] = {}
        self._per_owner: dict[str, int] = {}
        self._degraded: set[int] = set()  # subscriptions held to one attempt in flight
        self._recorder = Recorder(pool)
        self._box = SecretBox(settings.encryption_key)
        self._secrets: dict[str, str] = {}
        self.listener = Listener(settings.database_url, self._notified)
        # Fan-out runs when a NOTIFY came or the poll interval passed, not on every wake:
        # under load most wakes are finished deliveries freeing a slot.
        self._outbox_due = True
        self._last_fanout = 0.0
        self._main: asyncio.Task[None] | None = None
        # The listener pid this worker's wakeup row is armed with (None: not armed).
        self._armed_pid: int | None = None
        self._armed_at: float | None = None

    @property
    def pool(self) -> AsyncConnectionPool:
        """The worker's connection pool."""
        return self._pool

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
        self._notified()

    def _notified(self) -> None:
        self._outbox_due = True
        self._wake.set()

    async def run(self) -> None:
        """Runs until stop(); then drains as described in the module docstring."""
        if self.settings.lease <= self.settings.delivery_timeout:
            log.warning("WEBHOOKS_LEASE (%gs) should exceed WEBHOOKS_DELIVERY_TIMEOUT (%gs), "
                        "or slow attempts may be sent twice at once",
                        self.settings.lease, self.settings.delivery_timeout)
        helpers = [
            asyncio.create_task(self._supervise("listener", self.listener.run),
                                name="webhooks-listener"),
            asyncio.create_task(self._supervise("pruner", self._prune_loop),
                                name="webhooks-prune"),
        ]
        recorder = asyncio.create_task(self._supervise("recorder", self._recorder.run),
                                       name="webhooks-recorder")
        log.info("worker started", extra={"concurrency": self.concurrency})
        try:
            await self._loop()
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self._drain(recorder)
            await self._disarm()
            log.info("worker stopped", extra={"released": self.stats.released})

    async def _supervise(self, task: str, run: Callable[[], Awaitable[None]]) -> None:
        """Runs `run()` until it returns, restarting it after a crash (logged at ERROR with
        its traceback, counted in metrics, written to webhooks.worker_tasks) with
        exponential backoff and jitter. Cancellation stops it."""
        loop = asyncio.get_running_loop()
        backoff = RESTART_MIN
        while True:
            started = loop.time()
            try:
                await run()
                return
            except Exception as exc:
                if loop.time() - started >= RESTART_RESET:
                    backoff = RESTART_MIN  # it ran fine for a while: a fresh failure
                delay = await self._crashed(task, exc, backoff)
                await asyncio.sleep(delay)
                backoff = min(backoff * 2, RESTART_MAX)

    async def _crashed(self, task: str, exc: BaseException, backoff: float) -> float:
        """Reports a crash of `task`; returns how long to wait before restarting it."""
        delay = backoff * random.uniform(0.5, 1.5)
        restarts = self.task_restarts[task] = self.task_restarts.get(task, 0) + 1
        self.metrics.task_restarts.labels(task).inc()
        log.error("worker task %s crashed (restart %d), restarting in %.2fs\n%s", task,
                  restarts, delay, "".join(traceback.format_exception(exc)).rstrip(),
                  exc_info=exc, extra={"task": task, "restarts": restarts})
        error = pg_text(redact(f"{type(exc).__name__}: {exc}"))
        try:
            async with asyncio.timeout(HEALTH_WRITE_TIMEOUT):
                async with self._pool.connection() as conn:
                    await conn.execute(query("task_crashed"), {
                        "worker": self.name, "task": task, "restarts": restarts,
                        "error": error})
        except Exception as write_error:
            # The database may be what failed; the log line and the metric remain.
            log.warning("could not record the crash of task %s in webhooks.worker_tasks: %s",
                        task, write_error)
        return delay

    async def _loop(self) -> None:
        backoff = 0.1
        self._wake.set()  # catch up with whatever is already waiting
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                wait = await self._step()
            except (psycopg.Error, OSError) as exc:
                # Postgres restarting, a network blip: the tables still hold all the work.
                self.stats.db_errors += 1
                log.warning("database error in worker loop, retrying: %s", exc)
                await self._pause(backoff * random.uniform(0.5, 1.5))
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception as exc:
                # A bug: the loop is the worker, so it is restarted in place, like a task.
                await self._pause(await self._crashed("loop", exc, backoff))
                backoff = min(backoff * 2, RESTART_MAX)
                continue
            backoff = 0.1
            await self._wait(wait)

    async def _pause(self, seconds: float) -> None:
        """Sleeps `seconds`, or less if the worker is stopped meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _step(self) -> float:
        loop = asyncio.get_running_loop()
        if self._outbox_due or loop.time() - self._last_fanout >= self._fanout_interval():
            self._outbox_due = False
            self._last_fanout = loop.time()
            try:
                drained = await drain_outbox(self._pool, self.settings.batch_size,
                                             self.settings.max_row_bytes)
                self.stats.fanned_out += drained.created
                self.metrics.fanned_out.inc(drained.changes)
            except BaseException:
                self._outbox_due = True
                raise
            if drained.locked:
                await self._update_wakeup(taken=drained.taken)
        self._mark_slow(loop.time())
        free = self.concurrency - len(self._inflight)
        if free <= 0 or (self._inflight and free < self._claim_min):
            # Finishing tasks wake us; claiming a few slots at a time would cost one
            # round trip per delivery or two, so wait until a quarter of them are free.
            return self.settings.poll_interval
        claims = await delivery.claim(
            self._pool, limit=min(free, self.settings.batch_size),
            per_target=self.settings.per_target_concurrency, busy=self._per_sub,
            lease=self.settings.lease, scan=self.settings.batch_size, degraded=self._degraded,
            per_owner=self.per_owner, busy_owners=self._per_owner)
        for c in claims:
            self._start(c)
        if claims:
            return 0.0
        saturated = delivery.saturated(self._per_sub, self.settings.per_target_concurrency,
                                       self._degraded)
        owners = delivery.saturated_owners(self._per_owner, self.per_owner)
        async with self._pool.connection() as conn:
            cur = await conn.execute(query("next_due"), {"saturated": saturated,
                                                         "saturated_owners": owners})
            row = await cur.fetchone()
        due = row[0] if row else None
        until_fanout = self._last_fanout + self._fanout_interval() - loop.time()
        if due is None:
            return max(until_fanout, MIN_WAIT)
        return min(max(due, MIN_WAIT), max(until_fanout, MIN_WAIT))

    def _mark_slow(self, now: float) -> None:
        """Degrades subscriptions with an attempt in flight for longer than SLOW_AFTER.

        A hanging target is noticed well before its attempts time out, so it cannot hold
        its full share of slots for a whole timeout.
        """
        slow_after = min(SLOW_AFTER, self.settings.delivery_timeout / 4)
        for claim, started in self._inflight.values():
            if now - started > slow_after:
                self._degraded.add(claim.subscription_id)

    def _fanout_interval(self) -> float:
        """How long the outbox may go unchecked without a notification.

        Not armed (busy with a backlog, or not yet listening), no notification comes:
        the outbox is checked every 50 ms. Right after arming, a writer whose trigger ran
        before the wakeup row was visible may still commit without a NOTIFY: the outbox is
        checked again 50 ms, then about 100, 200, 400 ms ... after arming, up to the poll
        interval, which covers notifications lost any other way.
        """
        if self._armed_pid is None or self._armed_at is None or \
                self.listener.pid != self._armed_pid:
            # Not armed, or the listener that was is gone (reconnecting): no NOTIFY comes.
            return RECHECK_MIN
        since = asyncio.get_running_loop().time() - self._armed_at
        return min(max(since, RECHECK_MIN), self.settings.poll_interval)

    async def _update_wakeup(self, taken: int) -> None:
        """Arms the wakeup row when the outbox is empty, disarms it under a backlog.

        A backlog is a fan-out batch that came back full: writers commit faster than one
        notification per batch could help, and the worker checks every 50 ms anyway. A
        steady, light load (a few statements per fan-out) stays armed, so each commit's
        NOTIFY keeps its latency low.
        """
        now = asyncio.get_running_loop().time()
        if taken >= self.settings.batch_size:
            if self._armed_pid is not None:
                self.stats.disarmed += 1
                await self._disarm()
            return
        if taken > 0:
            return
        pid = self.listener.pid
        if pid is None or pid == self._armed_pid:
            return
        async with self._pool.connection() as conn:
            await conn.execute(query("wakeup_arm"), {"pid": pid, "old_pid": self._armed_pid})
        self._armed_pid, self._armed_at = pid, now
        self._outbox_due = True  # check once more: a commit may have raced the arming

    async def _wait(self, timeout: float) -> None:
        if timeout <= 0 or self._stopping.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _disarm(self) -> None:
        if self._armed_pid is None:
            return
        try:
            async with self._pool.connection() as conn:
                await conn.execute(query("wakeup_disarm"), {"pid": self._armed_pid})
        except (psycopg.Error, OSError) as exc:
            # A row left behind only costs writers a NOTIFY; the next arming removes it.
            log.warning("could not remove the wakeup row: %s", exc)
        self._armed_pid = self._armed_at = None

    def _start(self, c: Claim) -> None:
        self.stats.claimed += 1
        self._inflight[c.id] = (c, asyncio.get_running_loop().time())
        self._per_sub[c.subscription_id] = self._per_sub.get(c.subscription_id, 0) + 1
        self._per_owner[c.owner] = self._per_owner.get(c.owner, 0) + 1
        task = asyncio.create_task(self._deliver(c))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _open_secret(self, stored: str) -> str:
        # Decrypting is far slower than signing: keep each subscription's plain secret.
        secret = self._secrets.get(stored)
        if secret is None:
            if len(self._secrets) >= SECRET_CACHE:
                self._secrets.clear()
            secret = self._secrets[stored] = self._box.open(stored)
        return secret

    async def _deliver(self, c: Claim) -> None:
        """Sends one claimed delivery and hands its outcome to the recorder.

        Whatever happens the slot is freed (finally). An attempt that raises something
        unexpected is recorded as a failed attempt (status 0) and retried on the schedule;
        only shutdown's cancellation leaves the claim in flight, for _drain to release.
        """
        attempted_at = datetime.now(UTC)
        started = asyncio.get_running_loop().time()
        try:
            try:
                outcome = await self._attempt(c)
            except Exception as exc:
                log.error("delivery %d: the attempt failed unexpectedly; recorded as a "
                          "failed attempt\n%s", c.id, traceback.format_exc(),
                          exc_info=exc, extra={"delivery_id": c.id,
                                               "subscription_id": c.subscription_id})
                duration_ms = (asyncio.get_running_loop().time() - started) * 1000.0
                outcome = delivery.crashed(c, self.settings, exc, attempted_at, duration_ms)
            # Handed over in one step (no await between): the recorder owns it now.
            self._inflight.pop(c.id, None)
            self._recorder.add(outcome)
            self.metrics.observe(outcome.outcome, outcome.duration_ms)
            # A target that did not answer, or answered 5xx/429, gets one attempt in flight
            # until it succeeds again: hanging targets cannot take every slot.
            if 200 <= outcome.status < 300:
                self._degraded.discard(c.subscription_id)
            elif outcome.status == 0 or outcome.status == 429 or outcome.status >= 500:
                self._degraded.add(c.subscription_id)
            if outcome.outcome == "succeeded":
                self.stats.succeeded += 1
            elif outcome.outcome == "pending":
                self.stats.retried += 1
            else:
                self.stats.failed += 1
        except Exception:
            # Not even a failed outcome could be made: the lease brings the delivery back.
            self._inflight.pop(c.id, None)
            log.exception("delivery %d crashed; its lease will bring it back", c.id)
        finally:
            n = self._per_sub.get(c.subscription_id, 1) - 1
            if n > 0:
                self._per_sub[c.subscription_id] = n
            else:
                self._per_sub.pop(c.subscription_id, None)
            n = self._per_owner.get(c.owner, 1) - 1
            if n > 0:
                self._per_owner[c.owner] = n
            else:
                self._per_owner.pop(c.owner, None)
            self._wake.set()

    async def _attempt(self, c: Claim) -> delivery.Outcome:
        try:
            secret = self._open_secret(c.secret)
        except SecretsError as exc:
            # Never send unsigned: fail the attempt; a fixed key lets a retry through.
            return delivery.decide(c, self.settings, status=0, retry_after=None,
                                   attempted_at=datetime.now(UTC), duration_ms=0.0,
                                   error=str(exc))
        return await delivery.send(self._session, c, secret, self.settings)

    async def _drain(self, recorder: asyncio.Task[None]) -> None:
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks),
                                            timeout=self.settings.shutdown_grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self._recorder.close()
        await recorder
        leftover = [claim for claim, _ in self._inflight.values()]
        self._inflight.clear()
        try:
            await delivery.release(self._pool, leftover)
            self.stats.released += len(leftover)
        except (psycopg.Error, OSError) as exc:
            log.warning("could not release %d claims; their leases will: %s",
                        len(leftover), exc)

    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(PRUNE_EVERY)
            try:
                await prune(self._pool, self.settings.retention)
            except (psycopg.Error, OSError) as exc:
                log.warning("pruning failed, will retry: %s", exc)


async def prune(pool: AsyncConnectionPool, retention: float) -> int:
    """Deletes finished deliveries (with their attempts) and unused events past retention,
    and old crash records of worker tasks."""
    total = 0
    for name in ("prune_deliveries", "prune_events"):
        while True:
            async with pool.connection() as conn:
                cur = await conn.execute(query(name), {"retention": retention,
                                                       "limit": PRUNE_BATCH})
            total += cur.rowcount
            if cur.rowcount < PRUNE_BATCH:
                break
    async with pool.connection() as conn:
        cur = await conn.execute(query("relation_exists"), {"name": "webhooks.worker_tasks"})
        row = await cur.fetchone()
        if row is not None and row[0]:
            await conn.execute(query("prune_worker_tasks"), {"retention": retention})
    return total


@contextlib.asynccontextmanager
async def open_worker(settings: Settings, *, concurrency: int) -> AsyncIterator[Worker]:
    """A started Worker with its own pool and HTTP session, all closed on exit."""
    pool = make_pool(settings.database_url, min_size=2,
                     max_size=max(2, settings.pool_size), name="worker")
    await pool.open(wait=True)
    try:
        session = make_session(allow_private=settings.allow_private_targets,
                               max_connections=max(concurrency, 1),
                               dns_timeout=settings.dns_timeout,
                               dns_servers=settings.dns_servers)
        try:
            worker = Worker(settings, pool, session, concurrency=concurrency)
            worker.start()
            try:
                yield worker
            finally:
                await worker.stop()
        finally:
            await session.close()
    finally:
        await pool.close()


async def run_worker(settings: Settings, *, concurrency: int, metrics_port: int | None = None,
                     metrics_host: str = "127.0.0.1", stop: asyncio.Event | None = None
                     ) -> None:
    """Delivers until SIGTERM/SIGINT (or `stop` is set), then shuts down cleanly."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        async with open_worker(settings, concurrency=concurrency) as worker:
            refresher = None
            if metrics_port is not None:
                worker.metrics.serve(metrics_port, metrics_host)
                refresher = asyncio.create_task(worker.metrics.refresh_loop(worker.pool))
                log.info("metrics on http://%s:%d/metrics", metrics_host, metrics_port)
            await stop.wait()
            if refresher is not None:
                refresher.cancel()
            log.info("stopping: finishing in-flight deliveries",
                     extra={"grace": settings.shutdown_grace})
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
