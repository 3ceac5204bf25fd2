"""When the worker looks at the outbox: the conditional-NOTIFY protocol, told whole below."""

from __future__ import annotations

import enum
import logging
from typing import Protocol

from service.store import Store, StoreError

log = logging.getLogger("webhooks.worker")

# Shortest interval between outbox checks while no NOTIFY can come; also the first
# recheck after arming.
RECHECK_MIN = 0.05


class HasPid(Protocol):
    """What the protocol needs of the listener: its LISTEN connection's backend pid."""

    pid: int | None


class Step(enum.Enum):
    """What a fan-out's result asks of the wakeup row."""

    KEEP = "keep"
    ARM = "arm"
    DISARM = "disarm"


class Wakeup:
    """The conditional-NOTIFY protocol of one worker: when writers notify it, and when it
    checks the outbox without being notified.

    The contract, across the files that take part in it:

    1. Writers (the capture trigger, sql/triggers/capture.sql) put each captured statement
       in webhooks.outbox and send `NOTIFY webhooks` only while some row exists in
       webhooks.wakeups. Commits that NOTIFY serialise on a database-wide lock, so a
       busy system, whose workers poll anyway, sends none; Postgres folds the identical
       notifications of one transaction into one, delivered at commit.
    2. Each worker has one LISTEN connection (listener.py), outside the pool, in
       autocommit. Its backend pid names the worker's wakeup row. Every notification, and
       every (re)connection (to catch up on what was missed), marks the outbox due.
    3. Arming (`wakeup_arm` in sql/queries/worker.sql): after a fan-out that found the
       outbox empty or nearly so (point 4), with a listener whose pid is not the one
       armed, the worker inserts that pid in webhooks.wakeups, deleting its previous
       pid's row and the rows of pids no longer in pg_stat_activity (killed workers,
       restarts). A writer whose trigger ran before the row was visible commits without
       a NOTIFY, so the outbox is checked once more at once, then 50 ms, about 100, 200,
       400 ms ... after arming, up to the poll interval.
    4. Disarming (`wakeup_disarm`): a fan-out batch that came back full is a backlog:
       writers commit faster than one notification per batch could help. The worker
       deletes its row and checks the outbox every 50 ms. Re-arming does not wait for an
       empty outbox: a fan-out that took at most half a batch (the worker keeps up, with
       room to spare) arms again, so a steady load that leaves a few statements for every
       50 ms check goes back to NOTIFY and its latency to a round trip, instead of staying
       at polling speed for as long as the load lasts. Between half and a full batch the
       state is kept (no flapping at the boundary); an armed worker stays armed on any
       partial batch, so a steady light load keeps each commit's NOTIFY.
    5. While not armed, or armed with a listener pid that is gone (the listener is
       reconnecting), no NOTIFY can come: the outbox is checked every 50 ms, and the next
       fan-out of at most half a batch arms with the new pid.
    6. Only the worker that held the fan-out lock learns how full the outbox was; the
       others keep their state. Shutdown disarms. A row left behind (a crash, a failed
       delete) only costs writers a NOTIFY; the next arming of any worker removes it.
    7. NOTIFY only wakes: the outbox is the truth, and the poll interval recovers anything
       a lost notification would have left behind. Fan-out runs when a notification came
       or the interval passed, not on every wake (most wakes are freed delivery slots).
    8. Concurrent writers notify one at a time: a writer notifies only while it holds the
       wakeup's token (webhooks.notify_lock_class, tried and never waited for, held to its
       commit), so the others' commits do not queue behind each other's NOTIFY. Their
       changes come with the notifying one's fan-out, or at the recheck: any fan-out that
       took something while armed starts the rechecks again from RECHECK_MIN (50 ms),
       as arming does. A long transaction that holds the token leaves the others to
       those rechecks until it ends.
    """

    def __init__(self, listener: HasPid, *, batch_size: int, poll_interval: float) -> None:
        self.listener = listener
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.outbox_due = True  # a worker starts by catching up
        self.last_fanout = 0.0
        self.armed_pid: int | None = None  # the listener pid the row was armed with
        self.armed_at: float | None = None

    def notified(self) -> None:
        """A notification (or a reconnection, or wake()) came: look at the outbox."""
        self.outbox_due = True

    def fanout_due(self, now: float) -> bool:
        """Whether the loop should fan out now; if so, the check counts as started."""
        if not self.outbox_due and now - self.last_fanout < self.interval(now):
            return False
        self.outbox_due = False
        self.last_fanout = now
        return True

    def fanout_failed(self) -> None:
        """The fan-out did not finish: look again on the next step."""
        self.outbox_due = True

    def interval(self, now: float) -> float:
        """How long the outbox may go unchecked without a notification (points 3 and 5)."""
        if self.armed_pid is None or self.armed_at is None or \
                self.listener.pid != self.armed_pid:
            return RECHECK_MIN
        return min(max(now - self.armed_at, RECHECK_MIN), self.poll_interval)

    def until_fanout(self, now: float) -> float:
        """Seconds until the next outbox check is due without a notification."""
        return self.last_fanout + self.interval(now) - now

    def decide(self, taken: int, limit: int | None = None) -> Step:
        """What a fan-out that took `taken` outbox rows of the `limit` it could take (the
        batch size unless given) asks of the row (points 3 and 4)."""
        full = self.batch_size if limit is None else limit
        if taken >= full:
            return Step.DISARM if self.armed_pid is not None else Step.KEEP
        if taken > full // 2:
            return Step.KEEP  # between half and a full batch: no flapping
        pid = self.listener.pid
        if pid is None or pid == self.armed_pid:
            return Step.KEEP
        return Step.ARM

    async def after_fanout(self, store: Store, taken: int, now: float,
                           limit: int | None = None) -> Step:
        """Arms or disarms as `decide` says; returns the step taken."""
        step = self.decide(taken, limit)
        if step is Step.DISARM:
            await self.disarm(store)
        elif step is Step.ARM:
            await self._arm(store, now)
        elif taken and self.armed_at is not None:
            self.armed_at = now  # point 8: the rechecks start again from RECHECK_MIN
        return step

    async def _arm(self, store: Store, now: float) -> None:
        pid = self.listener.pid
        await store.arm_wakeup(pid=pid, old_pid=self.armed_pid)
        self.armed_pid, self.armed_at = pid, now
        self.outbox_due = True  # check once more: a commit may have raced the arming

    async def disarm(self, store: Store) -> None:
        """Removes the worker's row, if armed; a failure is logged (point 6)."""
        if self.armed_pid is None:
            return
        try:
            await store.disarm_wakeup(pid=self.armed_pid)
        except StoreError as exc:
            log.warning("could not remove the wakeup row: %s", exc)
        self.armed_pid = self.armed_at = None
