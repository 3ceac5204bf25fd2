"""The worker's delivery slots and the isolation between targets and between owners.

A worker has `concurrency` slots, its capacity, which adapts to the machine (capacity.py
calls resize()); the per-owner share follows it. Each subscription may have its window of
deliveries in flight, one while degraded, and an owner's degraded subscriptions start
attempts while those hold less than half of its cap (the caps adapt to the answers:
caps.py).

No owner holds more than `per_owner` slots while another owner has work in flight (or had
recently); an owner alone that has had a fast 2xx answer in the last minute may borrow
beyond it up to all but a reserve of a quarter of the slots (its struggling targets still
hold one slot each), which stays free for the next owner that comes, so
isolation holds while a lone owner is not halved.

Claims run ahead of the sends (ahead.py): those beyond what may be sent now wait here, in
start order per subscription, and go out as the sends before them finish. A subscription
that becomes degraded gives its waiting claims back (stranded()).
"""

from __future__ import annotations

from collections import deque
from typing import TypeVar

from service.worker.ahead import AHEAD, AHEAD_BASE, ClaimsAhead
from service.worker.delivery import Claim

Key = TypeVar("Key", int, str)


def _decrement(counts: dict[Key, int], key: Key) -> None:
    n = counts.get(key, 1) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)


class Slots(ClaimsAhead):
    """Who holds the worker's slots: claims in flight, counted per subscription and owner,
    and the adaptive caps the next claim must respect."""

    def __init__(self, concurrency: int, *, per_target: int, per_owner: int | None = None,
                 batch_size: int, slow_after: float) -> None:
        super().__init__(per_target=per_target, slow_after=slow_after)
        self.per_owner_setting = per_owner
        self.batch_size = batch_size
        self.resize(concurrency)
        self.peak = 0  # the most sending at once since take_peak()
        # Claimed, outcome not yet handed over: delivery id -> (claim, when it was claimed).
        self.inflight: dict[int, tuple[Claim, float]] = {}
        self.busy: dict[int, int] = {}  # subscription id -> claims held (waiting or sent)
        self.busy_owners: dict[str, int] = {}
        # Claims waiting to be sent: per owner, per subscription in start order (insertion
        # order: the owners' and subscriptions' turn when several wait).
        self.waiting: dict[str, dict[int, deque[Claim]]] = {}
        self.waiting_sids: set[int] = set()
        self.sending: dict[int, int] = {}  # subscription id -> attempts under way
        self.sending_owners: dict[str, int] = {}
        self.sending_total = 0
        self.started: dict[int, float] = {}  # delivery id -> when its attempt started
        # Attempts started while their subscription was degraded, and their count per
        # owner (ready(): they hold at most half of an owner's cap).
        self.started_degraded: set[int] = set()
        self.degraded_owners: dict[str, int] = {}

    def resize(self, concurrency: int) -> None:
        """The worker's capacity is `concurrency` slots now (capacity.py), and the caps
        that follow from it."""
        self.concurrency = max(1, concurrency)
        # One owner (all its subscriptions) never holds more of this worker's slots while
        # another owner has work in flight; alone and fast, it may borrow up to `lone_owner`.
        self.per_owner = self.per_owner_setting or max(1, self.concurrency // 2)
        self.lone_owner = max(self.per_owner, self.concurrency - max(1, self.concurrency // 4))
        # Claiming a few slots at a time costs a round trip per delivery or two: while
        # some are in flight, wait until a quarter of the slots are free.
        self.claim_min = max(1, min(self.batch_size, self.concurrency // 4))
        self.held_max = self.concurrency + (AHEAD - 1) * min(self.concurrency, AHEAD_BASE)
        # A claim takes a batch, or an eighth of a large capacity: slow targets' answers
        # come in waves of hundreds, refilled in fewer round trips.
        self.claim_max = max(self.batch_size, self.concurrency // 8)

    def take_peak(self) -> tuple[int, bool]:
        """The most sending at once since the last call, and whether owners at their cap
        have claims waiting now (for capacity.py)."""
        peak, self.peak = max(self.peak, self.sending_total), self.sending_total
        held = any(self.sending_owners.get(o, 0) >= self.owner_cap(o) for o in self.waiting)
        return peak, held

    def wanted(self) -> int:
        """How many deliveries to claim now (0: wait for slots to free up)."""
        free = self.held_max - len(self.inflight)
        if free <= 0 or (self.inflight and free < self.claim_min):
            return 0
        return min(free, self.claim_max)

    def take(self, claim: Claim, now: float) -> None:
        """`claim` is held from `now`, waiting to be sent (ready() sends it)."""
        self._now = now
        sid = claim.subscription_id
        self.inflight[claim.id] = (claim, now)
        self.busy[sid] = self.busy.get(sid, 0) + 1
        self.busy_owners[claim.owner] = self.busy_owners.get(claim.owner, 0) + 1
        if len(self.busy_owners) > 1:
            self.contended_at = now
        subs = self.waiting.get(claim.owner)
        if subs is None:
            subs = self.waiting[claim.owner] = {}
        queue = subs.get(sid)
        if queue is None:
            queue = subs[sid] = deque()
            self.waiting_sids.add(sid)
        queue.append(claim)

    def ready(self, now: float) -> list[Claim]:
        """The waiting claims that may be sent now, each counted as sending from `now`:
        every subscription's in start order, within its window, its owner's cap and the
        worker's slots. An owner at its cap is passed over whole, so the cost follows the
        owners and what is sent, not the subscriptions waiting."""
        out: list[Claim] = []
        if self.sending_total >= self.concurrency or not self.waiting:
            return out
        emptied_owners: list[str] = []
        for owner, subs in self.waiting.items():
            owner_cap = self.owner_cap(owner)
            owner_sending = self.sending_owners.get(owner, 0)
            if owner_sending >= owner_cap:
                continue
            # Degraded subscriptions (one attempt each) start attempts while those started
            # so hold less than half of the owner's cap: its many hanging targets then
            # leave the other half to its healthy ones, which waited for the hanging
            # attempts' timeouts before (20 changes 67-106 s late beside 200 of them).
            degraded_cap = max(1, owner_cap // 2)
            emptied: list[int] = []
            for sid, queue in subs.items():
                cap = self.cap(sid)
                degraded = sid in self.degraded
                if degraded and self.degraded_owners.get(owner, 0) >= degraded_cap:
                    continue
                sending = self.sending.get(sid, 0)
                while queue and sending < cap and owner_sending < owner_cap:
                    claim = queue.popleft()
                    sending += 1
                    owner_sending += 1
                    self.sending_total += 1
                    self.started[claim.id] = now
                    if degraded:
                        self.started_degraded.add(claim.id)
                        self.degraded_owners[owner] = self.degraded_owners.get(owner, 0) + 1
                    out.append(claim)
                    if self.sending_total >= self.concurrency:
                        break
                if sending:
                    self.sending[sid] = sending
                if not queue:
                    emptied.append(sid)
                if owner_sending >= owner_cap or self.sending_total >= self.concurrency:
                    break
            if owner_sending:
                self.sending_owners[owner] = owner_sending
            for sid in emptied:
                del subs[sid]
                self.waiting_sids.discard(sid)
            if not subs:
                emptied_owners.append(owner)
            if self.sending_total >= self.concurrency:
                break
        for owner in emptied_owners:
            del self.waiting[owner]
        if self.sending_total > self.peak:
            self.peak = self.sending_total
        return out

    def stranded(self) -> list[Claim]:
        """Takes the waiting claims of degraded subscriptions that have an attempt under
        way: they would wait behind a failing target for longer than their lease. The
        worker gives them back (due now, their attempt not counted)."""
        out: list[Claim] = []
        for sid in [s for s in self.waiting_sids if s in self.degraded and self.sending.get(s)]:
            self.waiting_sids.discard(sid)
            for owner in [o for o, subs in self.waiting.items() if sid in subs]:
                for claim in self.waiting[owner].pop(sid):
                    self.inflight.pop(claim.id, None)
                    _decrement(self.busy, sid)
                    _decrement(self.busy_owners, claim.owner)
                    out.append(claim)
                if not self.waiting[owner]:
                    del self.waiting[owner]
        return out

    def handed_over(self, claim: Claim) -> None:
        """The claim's outcome is the recorder's now: shutdown has nothing to give back."""
        self.inflight.pop(claim.id, None)

    def free(self, claim: Claim) -> None:
        """The claim's attempt is over: its subscription and owner hold one slot less."""
        sid = claim.subscription_id
        _decrement(self.busy, sid)
        _decrement(self.busy_owners, claim.owner)
        if self.started.pop(claim.id, None) is not None:
            _decrement(self.sending, sid)
            _decrement(self.sending_owners, claim.owner)
            self.sending_total -= 1
        if claim.id in self.started_degraded:
            self.started_degraded.discard(claim.id)
            _decrement(self.degraded_owners, claim.owner)

    def leftover(self) -> list[Claim]:
        """Takes the claims still held, waiting or sent (shutdown gives them back)."""
        claims = [claim for claim, _ in self.inflight.values()]
        self.inflight.clear()
        self.waiting.clear()
        self.waiting_sids.clear()
        return claims
