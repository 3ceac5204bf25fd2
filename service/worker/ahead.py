"""The claim side of the worker's slots (slots.py): how many claims may be held ahead of
the sends, and what the claim query is told of them.

Claims run ahead of the sends: a subscription may hold AHEAD times its window in claims
(SLOW_AHEAD for a slow target, one when degraded), an owner AHEAD times its cap, the
worker AHEAD times its slots (past AHEAD_BASE slots, AHEAD_BASE times AHEAD - 1 more). The
claims beyond what may be sent now wait in the slots, in start order per subscription,
and go out as the sends before them finish, so the senders never wait for a claim's round
trip. The claim query skips the saturated subscriptions and owners, so one slow target or
owner never blocks the queue of the others; the adaptive caps go in as counts shifted
from the query's one `per_target` and `per_owner`.
"""

from __future__ import annotations

from collections.abc import Collection

from service.worker.caps import Caps
from service.worker.delivery import Claim

# How many claims may be held per slot a subscription, an owner or the worker may send
# with: the sends under way and the claims waiting for them. A claim's round trip must not
# leave the senders idle, and the next claim starts only once a quarter of what is held
# has gone: with four, the senders ran dry behind half of the claims (bench/FINDINGS.md,
# "Since then"). The worker holds at most AHEAD x its capacity in claims, or its capacity
# and AHEAD - 1 times AHEAD_BASE beyond a capacity of AHEAD_BASE: slow targets free slots
# slowly, and each claim held keeps its body in memory.
AHEAD = 8
AHEAD_BASE = 64
# A target that answers in SLOW_AHEAD_MS or more frees its slots far more slowly than a
# claim's round trip: SLOW_AHEAD times its window is enough ahead. With AHEAD, the claims
# held went to the first few subscriptions of a queue in subscription order (500 targets
# answering in a second: 16 claims each for 60 of them, 2 sent, the rest waiting).
SLOW_AHEAD = 2
SLOW_AHEAD_MS = 100.0


class ClaimsAhead(Caps):
    """The claims held, as the next claim must count them."""

    def claim_cap(self, subscription_id: int) -> int:
        """How many claims of the subscription may be held: AHEAD times its window (the
        sends under way and the claims waiting for them), SLOW_AHEAD times for a target
        that answers in SLOW_AHEAD_MS or more, one when degraded."""
        if subscription_id in self.degraded:
            return 1
        window = self.windows.get(subscription_id)
        if window is not None and window.base_ms >= SLOW_AHEAD_MS:
            return SLOW_AHEAD * self.cap(subscription_id)
        return AHEAD * self.cap(subscription_id)

    def claim_owner_cap(self, owner: str) -> int:
        """How many claims of the owner may be held: AHEAD times its cap."""
        return AHEAD * self.owner_cap(owner)

    def claim_busy(self) -> dict[int, int]:
        """Held claims as the claim query takes them with `per_target=self.initial`: each
        shifted by how far its claim cap is from the initial window (degraded ones not:
        the query caps those at one)."""
        out: dict[int, int] = {}
        for sid in self.busy.keys() | self.resized:
            n = self.busy.get(sid, 0)
            if sid not in self.degraded:
                n += self.initial - self.claim_cap(sid)
            if n or sid in self.busy:
                out[sid] = n
        return out

    def claim_busy_owners(self) -> dict[str, int]:
        """Owners' held claims as the claim query takes them with `per_owner`: each
        shifted by how far its claim cap is from `per_owner` (every owner seen lately,
        or its first claim would stop at its share)."""
        out: dict[str, int] = {}
        for owner in self.busy_owners.keys() | self.fast_owners.keys():
            n = (self.busy_owners.get(owner, 0) + self.per_owner
                 - self.claim_owner_cap(owner))
            if n or owner in self.busy_owners:
                out[owner] = n
        return out

    def saturated(self) -> list[int]:
        """The subscriptions holding as many claims as they may."""
        return [sid for sid, n in self.busy.items() if n >= self.claim_cap(sid)]

    def saturated_owners(self) -> list[str]:
        """The owners holding as many claims as they may."""
        return [o for o, n in self.busy_owners.items() if n >= self.claim_owner_cap(o)]

    def view(self) -> tuple[dict[int, int], dict[str, int]]:
        """The in-flight counts per subscription and per owner, as a claim sees them."""
        return dict(self.busy), dict(self.busy_owners)

    def capped(self, view: tuple[dict[int, int], dict[str, int]],
               claims: Collection[Claim]) -> bool:
        """Whether a claim made when `view` was in flight stopped at a cap: some
        subscription or owner reached it with what the claim returned. Attempts that
        finished during the claim's round trip may have freed those caps already, so the
        worker claims again as slots free instead of taking the queue for drained."""
        busy, owners = dict(view[0]), dict(view[1])
        for c in claims:
            busy[c.subscription_id] = busy.get(c.subscription_id, 0) + 1
            owners[c.owner] = owners.get(c.owner, 0) + 1
        return (any(busy[c.subscription_id] >= self.claim_cap(c.subscription_id)
                    for c in claims)
                or any(owners[c.owner] >= self.claim_owner_cap(c.owner) for c in claims))
