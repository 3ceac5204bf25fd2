"""The delivery worker: wake on NOTIFY or poll, fan out the outbox, claim and deliver.

One loop per process does the database work: it fans out when the outbox is due, claims
what the slots allow, starts the claims' attempts and waits. Claimed deliveries wait in
the slots until they may be sent, and a fixed set of sender tasks sends them
(attempts.py), so the next claim is under way while the last one's deliveries are sent. A
Recorder writes finished attempts in batches. The rest runs beside the loop as supervised
side tasks: the listener, retention (pruning.py), backfills, the upkeep (upkeep.py: the
failure lifecycle, ANALYZE and VACUUM), a backlog's fan-out (outbox.py), the capacity.
Shutdown stops claiming, lets in-flight attempts finish within the grace period and gives
the rest back. The parts, made and tied together in crew.py: wakeup.py (when to look at
the outbox), pacing.py (when to claim, and how much), claims.py (the claim's round trips),
slots.py (who holds the slots), supervise.py (side tasks that crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg

from service.availability import wait_for_database, wait_until_migrated
from service.config import Settings
from service.curl import CurlClient
from service.store import QUEUE_SETTINGS, Store, StoreError, make_pool
from service.worker import capacity, delivery, tracing
from service.worker.crew import Crew
from service.worker.liveness import Liveness
from service.worker.metrics import WorkerMetrics
from service.worker.supervise import RESTART_MAX, cancel_all

log = logging.getLogger("webhooks.worker")


class Worker(Crew):
    """Delivers webhooks with the given store and HTTP session until stop() is called
    (the parts, and `queue` beside `store`: Crew)."""

    _main: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Starts the worker in the running loop."""
        self._main = asyncio.create_task(self.run(), name="webhooks-worker")

    async def stop(self) -> None:
        """Stops claiming, finishes or releases what is in flight, and waits for that."""
        self._stopping.set()
        self._wake.set()
        if self._main is not None:
            await self._main

    async def run(self) -> None:
        """Runs until stop(); then drains as described in the module docstring."""
        if self.settings.lease <= self.settings.delivery_timeout:
            log.warning("WEBHOOKS_LEASE (%gs) should exceed WEBHOOKS_DELIVERY_TIMEOUT (%gs), "
                        "or slow attempts may be sent twice at once",
                        self.settings.lease, self.settings.delivery_timeout)
        helpers, recorder = self._start_side_tasks()
        log.info("worker started", extra={
            "concurrency": self.concurrency, "capacity": self.capacity.limit,
            "memory_budget_mb": self.settings.memory_budget >> 20})
        try:
            await self._loop()
        finally:
            await cancel_all(helpers)
            released = await self._drain(recorder)
            await self.wakeup.disarm(self.store)
            log.info("worker stopped", extra={"released": released})

    async def _loop(self) -> None:
        backoff = 0.1
        self._wake.set()  # catch up with whatever is already waiting
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                wait = await self._step()
            except StoreError as exc:
                # Postgres restarting, a network blip: the tables still hold all the work.
                self.metrics.db_errors.inc()
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
            await self._wait(wait)

    def _round_done(self) -> None:
        self.last_round = time.time()
        self.metrics.last_round.set(self.last_round)

    async def _pause(self, seconds: float) -> None:
        """Sleeps `seconds`, or less if the worker is stopped meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _step(self) -> float:
        """Fans out if due, claims what the slots allow; returns how long to wait.

        While a backlog is being fanned out beside the loop (Outbox.catch_up), the loop only
        claims: the notifications that come meanwhile wait for the catch-up to end."""
        loop = asyncio.get_running_loop()
        if self.outbox.due(loop.time()):
            wait = await self._fan_out_and_claim()
            if wait is not None:
                return wait
            # No free slot, or the batch failed on its data: fanned out beside the loop
            # (carefully, when it must be).
            self.outbox.catch_up()
            # Whatever made the outbox due (a commit, an API action's NOTIFY, the poll
            # interval) may have made deliveries due too.
            self.pacing.ask()
        now = loop.time()
        self.slots.mark_slow(now)
        await self.claims.give_back_stranded()
        until_fanout = self.outbox.until_fanout(now)
        idle = self.pacing.idle(now)
        if idle is not None:
            return min(idle, until_fanout)
        wanted = self.slots.wanted()
        if wanted == 0:
            # Finishing attempts wake us; then claim.
            self.pacing.ask()
            return self.settings.poll_interval
        rows = await self.claims.claim(wanted, now)
        claims = delivery.in_start_order(rows)
        self._attempts.start(claims)
        await self.claims.close_inactive(rows)
        return await self.claims.paced(claims, wanted, now, until_fanout)

    async def _fan_out_and_claim(self) -> float | None:
        """One fan-out batch and the claim of what is due, in one round trip and one
        transaction (Outbox.fan_out). Returns how long to wait, or None when this does not
        apply (no free slot, or the batch failed on its data: then the catch-up's careful
        path runs and the claim follows it)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.slots.mark_slow(now)
        wanted = self.slots.wanted()
        if wanted == 0:
            return None
        # A quiet queue: the fan-out leases what it makes, and no claim follows it.
        quiet = self.pacing.quiet(now)
        if not quiet:
            await self.claims.walk(now)
        limit = self.outbox.size.limit
        started = time.time_ns()
        done = await self.outbox.fan_out(self.pacing.claim_params(wanted), limit, quiet=quiet)
        if done is None:
            return None
        batch, rows = done
        # The claims are this worker's from the commit on: sent whatever the bookkeeping
        # below meets (arming the wakeup row may fail on another connection, and the
        # claims would then wait out their lease).
        claims = delivery.in_start_order(rows)
        self._attempts.start(claims)
        tracing.tracer().fanout(started, batch.taken, batch.changes, batch.created)
        # The senders go first (a fresh change's POST is the latency that counts); the
        # bookkeeping below waits one turn of the loop.
        await asyncio.sleep(0)
        await self.claims.close_inactive(rows)
        await self.outbox.fanned_out(batch, limit)
        if batch.locked and batch.taken >= limit:
            self.outbox.catch_up()  # a backlog: fanned out beside the loop's claims
        if quiet and not (batch.locked and batch.quiet and batch.created == len(claims)):
            # Something was due after all, caps held some of the batch back, or another
            # worker fanned out: the claim runs at the next step, and a fan-out that a
            # notification brings first claims beside it (Pacing.not_quiet).
            self.pacing.not_quiet()
            return 0.0
        now = loop.time()
        return await self.claims.paced(claims, wanted, now, self.outbox.until_fanout(now))

    async def _wait(self, timeout: float) -> None:
        if timeout <= 0 or self._stopping.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)


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
