"""When the worker's loop claims, and how much it asks for.

Claims cost a round trip, so the loop claims only when one may find something: a
notification or a fan-out came, the last claim was full, a slot freed while caps held
deliveries back, or the earliest known due time passed. While caps hold work back, a
claim waits for a quarter of what was in flight to free (or RECHECK_MIN): one claim round
trip serves several slots. Pacing does no I/O: the loop runs the claims and the
`next_due` query it asks for.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime

from service.store.worker import ClaimParams, OthersDue
from service.worker.delivery import Claim
from service.worker.slots import Slots
from service.worker.wakeup import RECHECK_MIN

# Shortest sleep when work is due but could not be claimed (locked by another worker).
MIN_WAIT = 0.01
# While claims find work, how often the lane for other queues looks for queues the
# claims should take from beside the oldest (the claim reads the oldest first: without
# it, a fresh delivery waited behind every older one of another owner), and how many
# subscriptions with pending deliveries one walk visits (the next walk goes on from there).
LANE_EVERY = 0.2
LANE_STEPS = 256
# The most queues the lane keeps (one per owner first): the claim probes each.
LANE_TAKE = 32
# The walk costs a probe of every partition's pending index per subscription visited
# (2.5 ms for 256 of a 10,000-subscription fan-out with three days of partitions; more
# with more days): the next one waits at least this many times as long as the last one
# took, so the lane takes at most 2% of the time.
LANE_SPACING = 50.0


class Lane:
    """The queues the claims take from beside the oldest: those the lane's walks found
    with due deliveries (others_due), each kept while it has some. A queue found once
    drains at its subscription's window, not one delivery per walk. At most LANE_TAKE,
    chosen one per owner first, the queues already kept first within each owner's turn,
    so one owner's many queues never keep another's out."""

    def __init__(self) -> None:
        self.queues: dict[int, tuple[str, datetime]] = {}  # sid: (owner, its probe's day)

    def found(self, others: OthersDue) -> None:
        """Adds what a walk found."""
        found = {sid: (owner, since) for sid, owner, since
                 in zip(others["sids"], others["owners"], others["created"], strict=True)}
        # The kept ones first: within an owner, they take its first turns.
        queues = self.queues | {sid: q for sid, q in found.items() if sid not in self.queues}
        turns: dict[str, int] = {}
        ranked: list[tuple[int, bool, int]] = []
        for sid, (owner, _) in queues.items():
            turns[owner] = turns.get(owner, 0) + 1
            ranked.append((turns[owner], sid not in self.queues, sid))
        self.queues = {sid: queues[sid] for _, _, sid in sorted(ranked)[:LANE_TAKE]}

    def params(self) -> dict[int, datetime]:
        """The queues for a claim, each with the day its probe starts at."""
        return {sid: since for sid, (_, since) in self.queues.items()}

    def claimed(self, claims: Collection[Claim], wanted: int, asked: ClaimParams | None
                ) -> None:
        """After a claim of `asked` (None: not known) that asked for `wanted`: a queue it
        took nothing from, though it could (no cap held that queue back, and the lane's
        queues, which the claim takes first, did not fill it), has nothing due any more
        and is dropped. A full claim of other queues' deliveries says nothing of the
        lane's."""
        if not self.queues:
            return
        took = {c.subscription_id for c in claims if c.subscription_id in self.queues}
        if sum(c.subscription_id in took for c in claims) >= wanted:
            return
        held = set(asked["saturated"]) if asked else set()
        held_owners = set(asked["saturated_owners"]) if asked else set()
        self.queues = {sid: (owner, since) for sid, (owner, since) in self.queues.items()
                       if sid in took or sid in held or owner in held_owners}


def saturated(busy: Mapping[int, int], per_target: int, degraded: Collection[int]
              ) -> list[int]:
    """The subscriptions at their cap: `per_target` in flight, or 1 when degraded."""
    return [sid for sid, n in busy.items() if n >= (1 if sid in degraded else per_target)]


def saturated_owners(busy_owners: Mapping[str, int], per_owner: int | None) -> list[str]:
    """The owners with `per_owner` deliveries in flight (none when there is no cap)."""
    if per_owner is None:
        return []
    return [owner for owner, n in busy_owners.items() if n >= per_owner]


def claim_params(*, limit: int, per_target: int, busy: Mapping[int, int], lease: float,
                 scan: int, degraded: Collection[int] = (), per_owner: int | None = None,
                 busy_owners: Mapping[str, int] | None = None,
                 lane: Mapping[int, datetime] | None = None,
                 since: datetime | None = None) -> ClaimParams:
    """The parameters of the claim query, the one place they are built (the claim's and a
    quiet queue's leasing fan-out's): up to `limit` deliveries, none of a subscription
    with `per_target` in `busy` (one when `degraded`), none of an owner with `per_owner`
    in `busy_owners` (None: no cap); `lane`: the queues the lane for
    other queues keeps (others_due), each with the day its probe starts at, claimed from
    beside the oldest; `since`: the queue's floor as last read (None: not known)."""
    owners = busy_owners or {}
    return {
        "lane_sids": list(lane or {}),
        "lane_since": list((lane or {}).values()),
        "limit": limit,
        "scan": max(scan, limit),
        "per_target": per_target,
        "per_owner": per_owner if per_owner is not None else 2**31 - 1,
        "lease": lease,
        "busy_ids": list(busy),
        "busy_counts": list(busy.values()),
        "saturated": saturated(busy, per_target, degraded),
        "degraded": list(degraded),
        "owner_names": list(owners),
        "owner_counts": list(owners.values()),
        "saturated_owners": saturated_owners(owners, per_owner),
        "since": since,
    }



class Pacing:
    """Whether a claim is due, its parameters, and how long to wait after it."""

    def __init__(self, slots: Slots, *, lease: float, scan: int) -> None:
        self.slots = slots
        self.lease = lease
        self.scan = scan
        self.claim_due = True
        self.due_at = 0.0  # loop time of the earliest known due delivery
        self.held_back = False
        self.freed = 0
        self.claim_batch = 1
        # The last claim found nothing more claimable (it was short and no cap held work
        # back): until due_at, a fan-out may lease what it makes (quiet()).
        self.drained = False
        self.view: tuple[dict[int, int], dict[str, int]] = ({}, {})
        self.asked: ClaimParams | None = None  # the last claim's parameters
        # The lane for other queues (lane_due): whether the last claim found work, when the
        # lane last ran and where its walk goes on.
        self.busy = False
        self.lane_at = float("-inf")  # loop time when the next walk is due
        self.lane_after = 0
        self.lane = Lane()
        # The queue's floor as last read (refresh_queue_floor, next_due), which the claims
        # and the fan-out pass on; None until then.
        self.since: datetime | None = None

    def ask(self) -> None:
        """Something may have made deliveries claimable (a notification, a fan-out, a
        lifecycle round, no free slot to claim with yet): claim at the next step."""
        self.claim_due = True

    def not_quiet(self) -> None:
        """A fan-out that leased found deliveries due that it did not lease (or could not
        tell): claim at the next step, and fan out with a claim beside it until a claim
        drains the queue again. Otherwise a notification coming before that step (every
        commit of a steady load) brought another leasing fan-out, which found the same
        deliveries due and leased nothing, and the claim waited for a step that no
        notification preceded: 100 ms and more at 200 commits/s."""
        self.claim_due = True
        self.drained = False

    def slot_freed(self) -> bool:
        """An attempt is over: a claim may find what the caps held back, once enough
        slots are free for it to be worth a round trip. Whether the loop should wake."""
        self.freed += 1
        if self.held_back and self.freed >= self.claim_batch:
            self.claim_due = True
        return self.claim_due

    def retry_due(self, at: float) -> None:
        """A retry was written, due at loop time `at`."""
        self.due_at = min(self.due_at, at)

    def idle(self, now: float) -> float | None:
        """How long until a claim is worth it, or None when it is now."""
        if not self.claim_due and now < self.due_at:
            return self.due_at - now
        return None

    def quiet(self, now: float) -> bool:
        """Whether, as far as this worker knows, nothing is waiting to be claimed: then a
        fan-out leases what it makes instead of a claim following it (the statement
        checks that nothing is due, and says when it was wrong)."""
        return self.drained and now < self.due_at

    def lane_due(self, now: float) -> bool:
        """Whether the next claim should also take the heads of other queues (others_due):
        every LANE_EVERY while claims find work."""
        return self.busy and now >= self.lane_at

    def lane_ran(self, others: OthersDue | None, started: float, now: float) -> None:
        """The lane's walk, started at `started`, found `others` (None: it failed); the
        next goes on after the last subscription it walked, when due: after LANE_EVERY,
        or LANE_SPACING times what this one took."""
        self.lane_after = others["last"] if others else 0
        if others:
            self.lane.found(others)
        self.lane_at = now + max(LANE_EVERY - (now - started),
                                 (LANE_SPACING - 1) * (now - started))

    def claim_params(self, wanted: int) -> ClaimParams:
        """The claim's parameters for `wanted` deliveries, noting what is in flight."""
        # What the query sees in flight: a short claim may have stopped at a cap that the
        # attempts finishing during its round trip have freed since (see claimed).
        self.view = self.slots.view()
        # The adaptive caps go in as shifted counts (ahead.py): one query shape for all.
        self.asked = claim_params(
            limit=wanted, per_target=self.slots.initial, busy=self.slots.claim_busy(),
            lease=self.lease, scan=self.scan, degraded=self.slots.degraded,
            per_owner=self.slots.per_owner, busy_owners=self.slots.claim_busy_owners(),
            lane=self.lane.params(), since=self.since)
        return self.asked

    def claimed(self, claims: Collection[Claim], wanted: int, now: float) -> float | None:
        """After a claim that asked for `wanted` (its attempts started): how long to wait,
        or None when the claim found nothing and the loop should ask when the next
        delivery is due (then next_due)."""
        self.busy = bool(claims)
        self.lane.claimed(claims, wanted, self.asked)
        if len(claims) >= wanted:
            self.claim_due = True  # a full claim: more may be due
            self.drained = False
            return 0.0
        # Everything claimable was claimed: until something changes, only the earliest
        # pending delivery of a subscription and owner below their caps brings work.
        saturated, saturated_owners = self.slots.saturated(), self.slots.saturated_owners()
        self.claim_due = False
        self.held_back = bool(saturated or saturated_owners
                              or self.slots.capped(self.view, claims))
        self.drained = not self.held_back
        # A quarter of what is held, at most a claim's worth (thousands in flight to slow
        # targets would otherwise wait for hundreds of slots).
        self.freed = 0
        self.claim_batch = max(1, min(len(self.slots.inflight) // 4, self.slots.batch_size))
        if claims:
            # Busy: what comes next is mostly freed slots, notifications and own retries,
            # each of which asks for a claim. Look again shortly rather than ask now when
            # the rest is due; an empty claim then asks (one round trip saved per claim).
            self.due_at = now + RECHECK_MIN
            return self.due_at - now
        return None

    def next_due(self, due: float | None, now: float) -> float:
        """The next delivery is due in `due` seconds (None: none is pending); how long
        to wait."""
        self.due_at = now + max(due, MIN_WAIT) if due is not None else float("inf")
        return self.due_at - now
