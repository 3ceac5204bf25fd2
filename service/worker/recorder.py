"""The recorder: finished attempts are written in batches, one batch at a time."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from operator import attrgetter

from service.logs import redact
from service.outcomes import Answer, classify
from service.store import Store, StoreError, StoreUnavailable
from service.worker.delivery import Outcome, pg_text

log = logging.getLogger("webhooks.delivery")

# A batch of fewer outcomes than GATHER waits up to GATHER_FOR seconds for more before it is
# written (not one of a strict subscription, whose record unparks its next delivery, and
# not at shutdown). At a steady light load each record otherwise wrote one outcome: a
# statement costing PostgreSQL about as much as the fan-out that made the delivery, and the
# worker a round trip, per event.
GATHER = 32
GATHER_FOR = 0.02


async def record(store: Store, outcomes: Sequence[Outcome]) -> None:
    """Writes a batch of outcomes in one transaction: deliveries, attempts, subscriptions.

    Error texts (a target's bytes, library messages) pass pg_text() here, the one place
    where text bound for Postgres is made storable. The batch goes sorted by subscription:
    the statement locks each outcome's subscription in that order (sql/queries/worker.sql),
    so two workers never take two subscriptions the other way round.
    """
    batch = json.dumps([
        [o.claim.id, o.claim.attempts, o.claim.subscription_id, o.status, o.outcome,
         o.retry_in, o.attempted_at, o.duration_ms, pg_text(o.error),
         o.claim.created_at.isoformat() if o.claim.created_at else None]
        for o in sorted(outcomes, key=attrgetter("claim.subscription_id"))])
    gone = sorted({o.claim.subscription_id for o in outcomes
                   if classify(o.status) is Answer.GONE})
    if not gone:
        # One statement, atomic by itself: one round trip, not BEGIN and COMMIT around it.
        finished = await store.record(batch=batch)
    else:
        async with store.transaction() as s:
            finished = await s.record(batch=batch)
            await s.stop_gone(subscription_ids=gone)
    if finished:
        # After the record's commit, so that it sees what parkers committed while the
        # record waited for a head's lock (sql/ordering.sql). The batch is written: a
        # failure here is left to the lifecycle round, which unparks a head left parked,
        # rather than raised for the batch to be written again.
        try:
            await store.unpark(subscription_ids=finished)
        except StoreError as exc:
            log.warning("unparking the next deliveries of strict subscriptions %s failed "
                        "(the lifecycle round will): %s", finished, redact(str(exc)))


def unreachable(exc: BaseException) -> bool:
    """Whether a failed write says the database is unreachable or busy (worth retrying the
    same statement later), not that this statement's data is refused."""
    if isinstance(exc, StoreUnavailable):
        return True
    if not isinstance(exc, StoreError):
        return False
    # Connection, resources, shutdown, serialization and deadlock, system errors: the
    # same statement may pass later.
    return (exc.sqlstate or "").startswith(("08", "53", "57P", "40", "58"))


class Recorder:
    """Collects finished attempts and writes them in batches, one batch at a time.

    While a batch is being written the next one accumulates, so under load each statement
    records many attempts; a small batch waits up to `gather_for` (GATHER_FOR) for more,
    unless it holds a strict subscription's outcome, so a light load's attempts are
    recorded a few at a time rather than one by one. A batch the database
    refuses (not a lost connection: bad data) is split in halves until the outcomes that
    can be written are; a single outcome that is still refused is logged and dropped (its
    delivery comes due again when its lease expires), so no outcome can wedge the others.
    """

    def __init__(self, store: Store,
                 on_written: Callable[[list[Outcome]], None] | None = None, *,
                 gather_for: float = GATHER_FOR) -> None:
        self._store = store
        self._on_written = on_written  # told of each batch written
        self._pending: list[Outcome] = []
        self._writing: list[Outcome] = []  # taken for the write under way
        self._ready = asyncio.Event()
        self._gather_for = gather_for
        self._gathering: asyncio.Future[None] | None = None  # a small batch waiting
        self._closing = False
        self.recorded = 0
        self.dropped = 0

    def add(self, outcome: Outcome) -> None:
        """Queues one outcome for the next batch."""
        self._pending.append(outcome)
        self._ready.set()
        if outcome.claim.strict or len(self._pending) >= GATHER:
            self._written_now()

    def _written_now(self) -> None:
        """Ends the wait of a small batch (_gather): it is written at once."""
        if self._gathering is not None and not self._gathering.done():
            self._gathering.set_result(None)

    async def _gather(self) -> None:
        """Lets a small batch wait up to gather_for for more outcomes; a strict
        subscription's outcome, a full batch or close() ends the wait."""
        if (self._closing or self._gather_for <= 0 or len(self._pending) >= GATHER
                or any(o.claim.strict for o in self._pending)):
            return
        loop = asyncio.get_running_loop()
        self._gathering = loop.create_future()
        timer = loop.call_later(self._gather_for, self._written_now)
        try:
            await self._gathering
        finally:
            timer.cancel()
            self._gathering = None

    @property
    def backlog(self) -> int:
        """Outcomes not yet written."""
        return len(self._pending) + len(self._writing)

    async def run(self) -> None:
        """Writes batches until close(). While the database is unreachable the same outcomes
        are retried with backoff; refused ones are split and, alone, dropped.

        Safe to call again after it raised (a supervisor restarting it): a batch that was
        being written is queued again first.
        """
        if self._writing:
            self._pending[:0] = self._writing
            self._writing = []
        backoff = 0.05
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            await self._gather()
            self._writing, self._pending = self._pending, []
            left = await self._write(self._writing)
            self._writing = []
            if not left:
                backoff = 0.05
                continue
            # Unrecorded attempts are retried by lease expiry at worst; keep trying.
            self._pending[:0] = left
            if self._closing and backoff > 2.0:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _write(self, batch: list[Outcome]) -> list[Outcome]:
        """Writes `batch`, halving refused parts; returns what is left unwritten because the
        database could not be reached (empty when everything was written or dropped)."""
        chunks = [batch]  # a stack: the first half of a split is written first
        while chunks:
            chunk = chunks.pop()
            try:
                await record(self._store, chunk)
            except Exception as exc:
                if unreachable(exc):
                    log.warning("recording %d attempts failed, will retry: %s",
                                sum(map(len, chunks)) + len(chunk), exc)
                    return chunk + [o for rest in reversed(chunks) for o in rest]
                if len(chunk) > 1:
                    half = len(chunk) // 2
                    chunks += [chunk[half:], chunk[:half]]
                    continue
                (o,) = chunk
                self.dropped += 1
                log.error("the attempt of delivery %d cannot be recorded and is dropped; its "
                          "lease brings the delivery back: %s", o.claim.id, redact(str(exc)),
                          extra={"delivery_id": o.claim.id,
                                 "subscription_id": o.claim.subscription_id})
            else:
                self.recorded += len(chunk)
                if self._on_written is not None:
                    self._on_written(chunk)
        return []

    def close(self) -> None:
        """Asks run() to return once everything queued is written."""
        self._closing = True
        self._ready.set()
        self._written_now()
