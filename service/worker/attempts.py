"""Attempts in flight: one task per claimed delivery sends it and hands its outcome over."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp

from service.config import Settings
from service.crypto import SecretBox, SecretsError
from service.worker import delivery
from service.worker.delivery import Claim, Outcome
from service.worker.metrics import WorkerMetrics, WorkerStats
from service.worker.recorder import Recorder
from service.worker.secret_cache import SecretCache
from service.worker.slots import Slots

log = logging.getLogger("webhooks.worker")


class Attempts:
    """Runs the attempts of claimed deliveries, each in its own task.

    Each outcome goes to the recorder, the metrics and the slots' isolation, and whatever
    happens the claim's slot is freed and the loop woken.
    """

    def __init__(self, settings: Settings, session: aiohttp.ClientSession, slots: Slots,
                 recorder: Recorder, *, stats: WorkerStats, metrics: WorkerMetrics,
                 wake: Callable[[], None]) -> None:
        self.settings = settings
        self._session = session
        self._slots = slots
        self._recorder = recorder
        self._stats = stats
        self._metrics = metrics
        self._wake = wake
        self._secrets = SecretCache(SecretBox(settings.encryption_key))
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, c: Claim) -> None:
        """Takes a slot for `c` and starts its attempt."""
        self._stats.claimed += 1
        self._slots.take(c, asyncio.get_running_loop().time())
        task = asyncio.create_task(self._deliver(c))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def finish(self, grace: float) -> None:
        """Waits up to `grace` seconds for the attempts in flight; cancels the rest, whose
        claims stay in the slots for shutdown to give back."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _deliver(self, c: Claim) -> None:
        """Sends one claimed delivery and hands its outcome to the recorder.

        An attempt that raises something unexpected is recorded as a failed attempt (status
        0) and retried on the schedule; only shutdown's cancellation leaves the claim in
        flight, for the worker to release.
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
            self._slots.handed_over(c)
            self._recorder.add(outcome)
            self._count(outcome)
        except Exception:
            # Not even a failed outcome could be made: the lease brings the delivery back.
            self._slots.handed_over(c)
            log.exception("delivery %d crashed; its lease will bring it back", c.id)
        finally:
            self._slots.free(c)
            self._wake()

    def _count(self, outcome: Outcome) -> None:
        self._metrics.observe(outcome.outcome, outcome.duration_ms)
        self._slots.answered(outcome.claim.subscription_id, outcome.status,
                             outcome.duration_ms, outcome.claim.owner)
        if outcome.outcome == "succeeded":
            self._stats.succeeded += 1
        elif outcome.outcome == "pending":
            self._stats.retried += 1
        else:
            self._stats.failed += 1

    async def _attempt(self, c: Claim) -> Outcome:
        try:
            secret = self._secrets.open(c.secret)
            previous = None if c.previous_secret is None else self._secrets.open(
                c.previous_secret)
        except SecretsError as exc:
            # Never send unsigned: fail the attempt; a fixed key lets a retry through.
            return delivery.decide(c, self.settings, status=0, retry_after=None,
                                   attempted_at=datetime.now(UTC), duration_ms=0.0,
                                   error=str(exc))
        return await delivery.send(self._session, c, secret, self.settings, previous)
