"""Attempts in flight: a set of sender tasks sends the claimed deliveries.

Claims wait in the slots (slots.py) until their subscription, owner and the worker have
room; then they go to a queue that as many sender tasks as the worker's capacity take
from (more are started as it grows: capacity.py), so no attempt costs a task of its own.
One watchdog bounds every attempt by WEBHOOKS_DELIVERY_TIMEOUT: it sleeps until the
earliest deadline and cancels a sender whose attempt is past it (the attempt then counts
as timed out), instead of a timer per attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable

from service.config import Settings
from service.crypto import SecretBox, SecretsError
from service.curl import CurlClient
from service.worker import delivery, tracing
from service.worker.delivery import Claim, Outcome
from service.worker.metrics import WorkerMetrics
from service.worker.recorder import Recorder
from service.worker.secret_cache import SecretCache
from service.worker.slots import Slots
from service.worker.supervise import cancel_all

log = logging.getLogger("webhooks.worker")

NO_DEADLINE = float("inf")


class Sender:
    """One sender task and the deadline of the attempt it is making."""

    __slots__ = ("deadline", "expired", "task")

    def __init__(self) -> None:
        self.deadline = NO_DEADLINE
        self.expired = False
        self.task: asyncio.Task[None] | None = None


class Attempts:
    """Sends claimed deliveries with a fixed set of sender tasks.

    Each outcome goes to the recorder, the metrics and the slots' isolation, and whatever
    happens the claim's slot is freed, the next waiting claims are sent and the loop woken.
    """

    def __init__(self, settings: Settings, session: CurlClient, slots: Slots,
                 recorder: Recorder, *, metrics: WorkerMetrics,
                 wake: Callable[[], None], stranded: Callable[[], None]) -> None:
        self.settings = settings
        self._session = session
        self._slots = slots
        self._recorder = recorder
        self._metrics = metrics
        self._wake = wake
        self._stranded = stranded  # a degraded subscription has claims waiting
        self._secrets = SecretCache(SecretBox(settings.encryption_key))
        self._tracer = tracing.tracer()
        self._queue: asyncio.Queue[Claim] = asyncio.Queue()
        self._senders: list[Sender] = []
        self._watchdog: asyncio.Task[None] | None = None
        self._watching = asyncio.Event()
        self._closing = False

    def start(self, claims: list[Claim]) -> None:
        """Holds `claims` (in start order) and sends those that may go now."""
        if len(self._senders) < self._slots.concurrency:
            self._start_senders()
        now = asyncio.get_running_loop().time()
        take = self._slots.take
        for c in claims:
            take(c, now)
        self._dispatch(now)

    def _start_senders(self) -> None:
        """As many senders as the worker's capacity (which grows: capacity.py)."""
        if self._closing:
            return
        for n in range(len(self._senders), self._slots.concurrency):
            sender = Sender()
            sender.task = asyncio.create_task(self._send_loop(sender),
                                              name=f"webhooks-sender-{n}")
            self._senders.append(sender)
        if self._watchdog is None:
            self._watchdog = asyncio.create_task(self._watch(), name="webhooks-deadlines")

    def resized(self) -> None:
        """The capacity changed: senders for it, and what may be sent now sent."""
        if self._senders and len(self._senders) < self._slots.concurrency:
            self._start_senders()
        if self._senders:
            self._dispatch(asyncio.get_running_loop().time())

    def _dispatch(self, now: float) -> None:
        if self._closing:
            return
        put = self._queue.put_nowait
        for c in self._slots.ready(now):
            put(c)

    async def finish(self, grace: float) -> None:
        """Sends nothing more; waits up to `grace` seconds for the attempts under way, then
        cancels the rest. Claims not finished stay in the slots for shutdown to give back."""
        self._closing = True
        if not self._senders:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while loop.time() < deadline and (not self._queue.empty() or any(
                s.deadline != NO_DEADLINE for s in self._senders)):
            await asyncio.sleep(0.01)
        tasks = [s.task for s in self._senders if s.task is not None]
        if self._watchdog is not None:
            tasks.append(self._watchdog)
        await cancel_all(tasks)
        self._senders.clear()

    async def _send_loop(self, sender: Sender) -> None:
        get = self._queue.get
        while True:
            c = await get()
            if self._closing:
                continue  # left in the slots: shutdown gives it back
            try:
                await self._deliver(c, sender)
            except Exception:
                log.exception("delivery %d: the sender failed; its lease brings it back",
                              c.id)

    async def _watch(self) -> None:
        """Cancels the attempts past their deadline; sleeps until the earliest one."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            earliest = NO_DEADLINE
            for sender in self._senders:
                if sender.deadline <= now:
                    if not sender.expired and sender.task is not None:
                        sender.expired = True
                        sender.task.cancel()
                elif sender.deadline < earliest:
                    earliest = sender.deadline
            if earliest == NO_DEADLINE:
                self._watching.clear()
                await self._watching.wait()
            else:
                await asyncio.sleep(earliest - now)

    async def _deliver(self, c: Claim, sender: Sender) -> None:
        """Sends one claimed delivery and hands its outcome to the recorder.

        An attempt that raises something unexpected is recorded as a failed attempt (status
        0) and retried on the schedule; only shutdown's cancellation leaves the claim in
        flight, for the worker to release.
        """
        loop = asyncio.get_running_loop()
        attempted_at = time.time()
        started = loop.time()
        sender.expired = False
        sender.deadline = started + self.settings.delivery_timeout
        if not self._watching.is_set():
            self._watching.set()
        try:
            try:
                outcome = await self._attempt(c, sender)
            except Exception as exc:
                log.error("delivery %d: the attempt failed unexpectedly; recorded as a "
                          "failed attempt\n%s", c.id, traceback.format_exc(),
                          exc_info=exc, extra={"delivery_id": c.id,
                                               "subscription_id": c.subscription_id})
                duration_ms = (loop.time() - started) * 1000.0
                outcome = delivery.crashed(c, self.settings, exc, attempted_at, duration_ms)
            finally:
                sender.deadline = NO_DEADLINE
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
            self._dispatch(loop.time())
            self._wake()

    def _count(self, outcome: Outcome) -> None:
        self._metrics.observe(outcome.outcome, outcome.duration_ms)
        sid = outcome.claim.subscription_id
        degraded = sid in self._slots.degraded
        self._slots.answered(sid, outcome.status, outcome.duration_ms, outcome.claim.owner)
        if not degraded and sid in self._slots.degraded and sid in self._slots.waiting_sids:
            self._stranded()

    async def _attempt(self, c: Claim, sender: Sender) -> Outcome:
        try:
            secret = self._secrets.open(c.secret)
            previous = None if c.previous_secret is None else self._secrets.open(
                c.previous_secret)
        except SecretsError as exc:
            # Never send unsigned: fail the attempt; a fixed key lets a retry through.
            return delivery.decide(c, self.settings, status=0, retry_after=None,
                                   attempted_at=time.time(), duration_ms=0.0,
                                   error=str(exc))
        return await delivery.send(self._session, c, secret, self.settings, previous,
                                   expired=lambda: sender.expired, tracer=self._tracer)

