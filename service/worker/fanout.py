"""Fan-out: captured changes leave the outbox as events with one delivery per subscriber."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from service.store import Store, StoreRejected
from service.store.fanout import FanoutParams
from service.store.worker import ClaimParams
from service.worker import tracing

log = logging.getLogger("webhooks.fanout")

# Held (per transaction) by the one worker fanning out at a time: see the fanout query.
FANOUT_LOCK = 0x77686B66  # "whkf"
# Tried by the fan-out of nothing that prepares a queue connection (Worker.prepare_queue):
# holding FANOUT_LOCK, it would make another worker's fan-out skip, taking it for the holder.
PREPARE_LOCK = 0x77686B70  # "whkp"

@dataclass(frozen=True)
class FanoutBatch:
    """What one fan-out statement did."""

    locked: bool
    taken: int  # outbox rows (statements)
    changes: int  # changed rows they held
    created: int
    rejected: int = 0  # changes set aside (webhooks.rejected_changes)
    # Whether no pending delivery was due, when asked to lease (`take` > 0).
    quiet: bool | None = None
    # The deliveries made leased, as JSON arrays of Claim's fields (delivery.leased).
    claims: list[list[Any]] | None = None


# Rows whose JSON is larger than this are delivered without their `resource` member.
DEFAULT_MAX_ROW_BYTES = 256 * 1024

# What one fan-out statement is sized for: the changes it reads plus the deliveries they
# make, about 70 ms of PostgreSQL's time on the reference machine.
FANOUT_WORK = 2_000
# How much larger than the last one the next fan-out may be, in statements.
GROWTH = 4


class FanoutSize:
    """How many outbox rows (captured statements) the next fan-out takes.

    WEBHOOKS_BATCH_SIZE statements while they are small; fewer while they are big (many
    changed rows, or many subscribers per change), so that one fan-out makes about
    FANOUT_WORK changes and deliveries whatever the statements hold. The loop claims
    nothing while a fan-out runs: 100 statements of 100 rows each were once 10,000
    deliveries made in one 0.6 s statement, with every attempt of the worker waiting
    behind it. Sized from the last batch, and growing from a few statements after quiet:
    a statement is never split, so one that alone holds more still goes in one fan-out.
    """

    def __init__(self, batch_size: int, work: int = FANOUT_WORK) -> None:
        self.batch_size = max(1, batch_size)
        self.work = work
        self.limit = min(self.batch_size, GROWTH)

    def learn(self, taken: int, changes: int, created: int) -> None:
        """Sizes the next fan-out after one that took `taken` statements: at most GROWTH
        times as many, so the first fan-out of a burst after quiet is small too."""
        if taken <= 0:
            return  # nothing was there: nothing learned
        per_statement = max(1.0, (changes + created) / taken)
        self.limit = max(1, min(self.batch_size, int(self.work / per_statement),
                                GROWTH * taken))


# A claim of nothing: the fan-out leases nothing (fanout_params without `lease`).
NO_LEASE: ClaimParams = {
    "limit": 0, "scan": 0, "per_target": 0, "per_owner": 0, "lease": 0.0, "busy_ids": [],
    "busy_counts": [], "saturated": [], "degraded": [], "owner_names": [],
    "owner_counts": [], "saturated_owners": [], "lane_sids": [], "lane_since": [],
    "since": None}


def fanout_params(limit: int, max_row_bytes: int, careful: bool = False,
                  lease: ClaimParams = NO_LEASE) -> FanoutParams:
    """The parameters of the fanout query; with a claim's parameters (`lease`), it leases
    up to their `limit` of the deliveries it makes when the queue is quiet."""
    return {"lock_key": FANOUT_LOCK, "limit": limit, "max_row_bytes": max_row_bytes,
            "careful": careful, "take": lease["limit"], "lease": lease["lease"],
            "per_target": lease["per_target"], "per_owner": lease["per_owner"],
            "busy_ids": lease["busy_ids"], "busy_counts": lease["busy_counts"],
            "saturated": lease["saturated"], "degraded": lease["degraded"],
            "owner_names": lease["owner_names"], "owner_counts": lease["owner_counts"],
            "saturated_owners": lease["saturated_owners"], "since": lease["since"]}


async def _fan_out(store: Store, limit: int, max_row_bytes: int,
                   careful: bool) -> FanoutBatch:
    started = time.time_ns()
    row = await store.fanout(FanoutBatch, fanout_params(limit, max_row_bytes, careful))
    assert row is not None
    tracing.tracer().fanout(started, row.taken, row.changes, row.created)
    return row


async def fan_out_batch(store: Store, limit: int,
                        max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> FanoutBatch:
    """Moves up to `limit` outbox rows to events and deliveries, in one transaction.

    A batch that fails on its data is done again carefully: changes that cannot become
    events are set aside with their reason, and the others go on. If even that fails, the
    first statement of the outbox is set aside whole, so one row never stops the queue.

    Errors of the data (SQLSTATE classes 22 and 54: a change PostgreSQL cannot turn into
    an event) are the ones retried carefully; any other error leaves the outbox as it is.
    """
    reason = ""
    for size, careful in ((limit, False), (limit, True), (1, True)):
        try:
            return await _fan_out(store, size, max_row_bytes, careful=careful)
        except StoreRejected as exc:
            if not exc.data_error:
                raise
            # Named after PostgreSQL's error (InvalidTextRepresentation...), not the store's.
            reason = f"{type(exc.__cause__ or exc).__name__}: {exc}"
            log.warning("fan-out of %d outbox row(s) failed on its data (%s)%s", size, reason,
                        "" if careful else "; retrying change by change")
    rejected = await store.reject_first_change(lock_key=FANOUT_LOCK, reason=reason[:4096])
    log.error("a captured statement could not be fanned out and was set aside "
              "(webhooks.rejected_changes): %s", reason)
    return FanoutBatch(locked=True, taken=max(rejected, 0), changes=0, created=0,
                       rejected=max(rejected, 0))

