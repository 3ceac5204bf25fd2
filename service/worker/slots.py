"""The worker's delivery slots and the isolation between targets and between owners.

A worker has `concurrency` slots. No subscription holds more than `per_target` of them,
and a degraded one (its target did not answer, or answered 429 or 5xx, or an attempt of
it has been in flight too long) holds one until it succeeds again; no owner holds more
than `per_owner`. The claim query skips the saturated ones, so one slow target or owner
never blocks the queue of the others.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, TypeVar

from service.outcomes import Answer, classify

if TYPE_CHECKING:
    from service.worker.delivery import Claim

Key = TypeVar("Key", int, str)


def saturated(busy: Mapping[int, int], per_target: int, degraded: Collection[int]
              ) -> list[int]:
    """The subscriptions at their cap: `per_target` in flight, or 1 when degraded."""
    return [sid for sid, n in busy.items() if n >= (1 if sid in degraded else per_target)]


def saturated_owners(busy_owners: Mapping[str, int], per_owner: int | None) -> list[str]:
    """The owners with `per_owner` deliveries in flight (none when there is no cap)."""
    if per_owner is None:
        return []
    return [owner for owner, n in busy_owners.items() if n >= per_owner]


def _decrement(counts: dict[Key, int], key: Key) -> None:
    n = counts.get(key, 1) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)


class Slots:
    """Who holds the worker's slots: claims in flight, counted per subscription and owner."""

    def __init__(self, concurrency: int, *, per_target: int, per_owner: int | None = None,
                 batch_size: int, slow_after: float) -> None:
        self.concurrency = max(1, concurrency)
        self.per_target = per_target
        # One owner (all its subscriptions) never holds more of this worker's slots.
        self.per_owner = per_owner or max(1, self.concurrency // 2)
        self.batch_size = batch_size
        # Claiming a few slots at a time costs a round trip per delivery or two: while
        # some are in flight, wait until a quarter of the slots are free.
        self.claim_min = max(1, min(batch_size, self.concurrency // 4))
        self.slow_after = slow_after
        # Claimed, outcome not yet handed over: delivery id -> (claim, when it started).
        self.inflight: dict[int, tuple[Claim, float]] = {}
        self.busy: dict[int, int] = {}  # subscription id -> claims in flight
        self.busy_owners: dict[str, int] = {}
        self.degraded: set[int] = set()  # subscriptions held to one attempt in flight

    def wanted(self) -> int:
        """How many deliveries to claim now (0: wait for slots to free up)."""
        free = self.concurrency - len(self.inflight)
        if free <= 0 or (self.inflight and free < self.claim_min):
            return 0
        return min(free, self.batch_size)

    def take(self, claim: Claim, now: float) -> None:
        """`claim` holds a slot from `now`."""
        self.inflight[claim.id] = (claim, now)
        self.busy[claim.subscription_id] = self.busy.get(claim.subscription_id, 0) + 1
        self.busy_owners[claim.owner] = self.busy_owners.get(claim.owner, 0) + 1

    def handed_over(self, claim: Claim) -> None:
        """The claim's outcome is the recorder's now: shutdown has nothing to give back."""
        self.inflight.pop(claim.id, None)

    def free(self, claim: Claim) -> None:
        """The claim's attempt is over: its subscription and owner hold one slot less."""
        _decrement(self.busy, claim.subscription_id)
        _decrement(self.busy_owners, claim.owner)

    def answered(self, subscription_id: int, status: int) -> None:
        """A target that did not answer, or answered 5xx/429, is degraded until it
        succeeds again: hanging targets cannot take every slot."""
        answer = classify(status)
        if answer is Answer.SUCCESS:
            self.degraded.discard(subscription_id)
        elif answer.struggling:
            self.degraded.add(subscription_id)

    def mark_slow(self, now: float) -> None:
        """Degrades subscriptions with an attempt in flight for longer than `slow_after`:
        a hanging target is noticed well before its attempts time out."""
        for claim, started in self.inflight.values():
            if now - started > self.slow_after:
                self.degraded.add(claim.subscription_id)

    def saturated(self) -> list[int]:
        """The subscriptions at their cap."""
        return saturated(self.busy, self.per_target, self.degraded)

    def saturated_owners(self) -> list[str]:
        """The owners at their cap."""
        return saturated_owners(self.busy_owners, self.per_owner)

    def leftover(self) -> list[Claim]:
        """Takes the claims still in flight (shutdown gives them back)."""
        claims = [claim for claim, _ in self.inflight.values()]
        self.inflight.clear()
        return claims
