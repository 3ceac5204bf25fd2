"""The worker's delivery slots and the isolation between targets and between owners.

A worker has `concurrency` slots, its capacity, which adapts to the machine (capacity.py
calls resize()); the per-owner share follows it. Each subscription has a window of
deliveries it may have in flight, which adapts like a congestion window: it starts at
INITIAL_WINDOW (or the maximum, if lower), grows while its target answers 2xx quickly
(by one per fast answer until its first trouble, then by about one per window of fast
answers), stops growing while answers slow down, and halves on trouble (no answer: a
timeout or a connection error, 429, 5xx). It never exceeds `per_target`
(WEBHOOKS_PER_TARGET_CONCURRENCY). A degraded subscription (its target did not answer,
or answered 429 or 5xx, or an attempt of it has been in flight too long: past
`slow_after`, or SLOW_FACTOR times its target's fastest recent answer when that is
longer) holds one slot until it succeeds again, and an owner's degraded subscriptions
start attempts while those hold less than half of its cap. A target slower than the slow
mark but steady grows its window slowly.

No owner holds more than `per_owner` slots while another owner has work in flight (or had
recently); an owner alone that has had a fast 2xx answer in the last minute may borrow
beyond it up to all but a reserve of a quarter of the slots (its struggling targets still
hold one slot each), which stays free for the next owner that comes, so
isolation holds while a lone owner is not halved. The claim query skips the saturated
subscriptions and owners, so one slow target or owner never blocks the queue of the others.

Claims run ahead of the sends: a subscription may hold AHEAD times its window in claims
(SLOW_AHEAD for a slow target, one when degraded), an owner AHEAD times its cap, the
worker AHEAD times its slots (past AHEAD_BASE slots, AHEAD_BASE times AHEAD - 1 more). The
claims beyond what may be sent now wait here, in start order per subscription, and go out
as the sends before them finish, so the senders never wait for a claim's round trip. A subscription
that becomes degraded gives its waiting claims back (stranded()).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import TypeVar

from service.outcomes import Answer, classify
from service.worker.delivery import Claim
from service.worker.window import (
    FORGET_AFTER,
    INITIAL_WINDOW,
    SLOW_FACTOR,
    Window,
)

Key = TypeVar("Key", int, str)

# How many claims may be held per slot a subscription, an owner or the worker may send
# with: the sends under way and the claims waiting for them. A claim of 100 takes 5 to
# 13 ms on a busy 2-core machine (its database, receiver and worker share the cores), in
# which the senders finish 30 to 80 deliveries, and the next claim starts only once a
# quarter of what is held has gone: with four, the senders ran dry behind about half of
# the claims (traced in `make bench`'s throughput, bench/HISTORY.md); eight keep them
# busy. The worker holds at most AHEAD x its capacity in claims, or its capacity and
# AHEAD - 1 times AHEAD_BASE beyond a capacity of AHEAD_BASE (slow targets free slots
# slowly: 2,000 in flight hold 2,448 claims, not 16,000 bodies), each with its body.
AHEAD = 8
AHEAD_BASE = 64
# A target that answers in SLOW_AHEAD_MS or more frees its slots far more slowly than a
# claim's round trip: SLOW_AHEAD times its window is enough ahead. With AHEAD, the claims
# held went to the first few subscriptions of a queue in subscription order (500 targets
# answering in a second: 16 claims each for 60 of them, 2 sent, the rest waiting).
SLOW_AHEAD = 2
SLOW_AHEAD_MS = 100.0
# Owners may borrow beyond their cap only when no other owner had work in flight for
# this long.
CONTENDED_HOLD = 1.0


def _decrement(counts: dict[Key, int], key: Key) -> None:
    n = counts.get(key, 1) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)


class Slots:
    """Who holds the worker's slots: claims in flight, counted per subscription and owner,
    and the adaptive caps the next claim must respect."""

    def __init__(self, concurrency: int, *, per_target: int, per_owner: int | None = None,
                 batch_size: int, slow_after: float) -> None:
        self.per_target = max(1, per_target)  # the most any window may grow to
        self.initial = min(INITIAL_WINDOW, self.per_target)
        self.per_owner_setting = per_owner
        self.batch_size = batch_size
        self.resize(concurrency)
        self.peak = 0  # the most sending at once since take_peak()
        self.slow_after = slow_after
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
        self.degraded: set[int] = set()  # subscriptions held to one attempt in flight
        # Attempts started while their subscription was degraded, and their count per
        # owner (ready(): they hold at most half of an owner's cap).
        self.started_degraded: set[int] = set()
        self.degraded_owners: dict[str, int] = {}
        self.windows: dict[int, Window] = {}
        # The subscriptions whose window is not the initial one: the claim's shifted
        # counts need only these and the busy ones (not every window of thousands).
        self.resized: set[int] = set()
        self.fast_owners: dict[str, float] = {}  # owner -> when it last answered fast
        self.contended_at = float("-inf")  # when two owners last had work in flight
        self._forgot_at = 0.0
        self._now = 0.0

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

    def answered(self, subscription_id: int, status: int, duration_ms: float | None = None,
                 owner: str | None = None) -> None:
        """Adapts to an answer (before its slot is freed). A target that did not answer, or
        answered 5xx/429, is degraded until it succeeds again (hanging targets cannot take
        every slot) and its window halves; a fast 2xx grows the window it was using."""
        answer = classify(status)
        if answer is Answer.SUCCESS:
            self.degraded.discard(subscription_id)
            if duration_ms is None:
                return
            slow_ms = self._slow_after(subscription_id) * 1000.0
            window = self._window(subscription_id)
            if window.before_slow is not None:
                window.answered_after_slow()
                self._note_size(subscription_id, window)
            if window.fast(duration_ms, slow_ms):
                # A quick answer for a target slower than the slow mark (SLOW_FACTOR) grows
                # its window by about one per window of answers, never as a fast one does,
                # and does not make its owner one that may borrow beyond its share.
                fast = duration_ms < self.slow_after * 500.0
                if owner is not None and fast:
                    self.fast_owners[owner] = self._now
                # Grown only while more than half of it is in use: a window a trickle
                # never fills stays put.
                if 2 * self.sending.get(subscription_id, 0) > int(window.size):
                    if fast:
                        window.grow(self.per_target)
                    else:
                        window.grow_slowly(self.per_target)
                    self._note_size(subscription_id, window)
        elif answer.struggling:
            self.degraded.add(subscription_id)
            window = self._window(subscription_id)
            window.shrink()
            self._note_size(subscription_id, window)

    def _slow_after(self, subscription_id: int) -> float:
        """How long an attempt of the subscription may be in flight before it counts as
        slow: `slow_after`, or SLOW_FACTOR times its target's fastest recent answer."""
        window = self.windows.get(subscription_id)
        if window is None or window.base_ms == float("inf"):
            return self.slow_after
        return max(self.slow_after, SLOW_FACTOR * window.base_ms / 1000.0)

    def _note_size(self, subscription_id: int, window: Window) -> None:
        if int(window.size) == self.initial:
            self.resized.discard(subscription_id)
        else:
            self.resized.add(subscription_id)

    def _window(self, subscription_id: int) -> Window:
        window = self.windows.get(subscription_id)
        if window is None:
            window = self.windows[subscription_id] = Window(
                size=float(self.initial), threshold=float(self.per_target))
        window.used_at = self._now
        return window

    def mark_slow(self, now: float) -> None:
        """Degrades subscriptions with an attempt in flight for longer than `slow_after` (or
        SLOW_FACTOR times their target's fastest recent answer, when that is longer):
        a hanging target is noticed well before its attempts time out. Also forgets the
        windows of subscriptions idle for FORGET_AFTER."""
        self._now = now
        # Oldest first (started in order): past the first recent one, all are recent.
        for delivery_id, started in self.started.items():
            if now - started <= self.slow_after:
                break
            held = self.inflight.get(delivery_id)
            sid = held[0].subscription_id if held is not None else None
            if (sid is not None and sid not in self.degraded
                    and now - started > self._slow_after(sid)):
                self.degraded.add(sid)
                window = self._window(sid)
                window.slow_mark()
                self._note_size(sid, window)
        if now - self._forgot_at > FORGET_AFTER / 4:
            self._forgot_at = now
            for sid in [s for s, w in self.windows.items()
                        if now - w.used_at > FORGET_AFTER and s not in self.busy]:
                del self.windows[sid]
                self.resized.discard(sid)
            for owner in [o for o, t in self.fast_owners.items() if now - t > FORGET_AFTER]:
                del self.fast_owners[owner]

    def cap(self, subscription_id: int) -> int:
        """How many deliveries of the subscription may be in flight now."""
        if subscription_id in self.degraded:
            return 1
        window = self.windows.get(subscription_id)
        return self.initial if window is None else max(1, int(window.size))

    def owner_cap(self, owner: str) -> int:
        """How many deliveries of the owner may be in flight now: its share, or, alone and
        answered fast lately, all but the reserve kept for the next owner. An owner whose
        targets never answer never borrows."""
        busy = self.busy_owners
        if (owner in self.fast_owners and (not busy or (len(busy) == 1 and owner in busy))
                and self._now - self.contended_at > CONTENDED_HOLD):
            return self.lone_owner
        return self.per_owner

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

    def leftover(self) -> list[Claim]:
        """Takes the claims still held, waiting or sent (shutdown gives them back)."""
        claims = [claim for claim, _ in self.inflight.values()]
        self.inflight.clear()
        self.waiting.clear()
        self.waiting_sids.clear()
        return claims
