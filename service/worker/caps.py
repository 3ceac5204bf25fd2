"""The adaptive caps of the worker's slots (slots.py): how many deliveries each subscription
and each owner may have in flight, and how answers and slow attempts move them.

Each subscription has a window of deliveries it may have in flight, which adapts like a
congestion window (window.py): it starts at INITIAL_WINDOW (or the maximum, if lower),
grows while its target answers 2xx quickly (by one per fast answer until its first
trouble, then by about one per window of fast answers), stops growing while answers slow
down, and halves on trouble (no answer: a timeout or a connection error, 429, 5xx). It
never exceeds `per_target` (WEBHOOKS_PER_TARGET_CONCURRENCY). A degraded subscription (its
target did not answer, or answered 429 or 5xx, or an attempt of it has been in flight too
long: past `slow_after`, or SLOW_FACTOR times its target's fastest recent answer when that
is longer) holds one slot until it succeeds again. A target slower than the slow mark but
steady grows its window slowly.

An owner holds at most `per_owner` slots while another owner has work in flight (or had
recently); an owner alone that has had a fast 2xx answer in the last minute may borrow
beyond it, up to `lone_owner`.
"""

from __future__ import annotations

from service.outcomes import Answer, classify
from service.worker.delivery import Claim
from service.worker.window import FORGET_AFTER, INITIAL_WINDOW, SLOW_FACTOR, Window

# Owners may borrow beyond their cap only when no other owner had work in flight for
# this long.
CONTENDED_HOLD = 1.0


class Caps:
    """The subscriptions' windows and degradation, the owners' fast answers, and the caps
    that follow from them. Slots (slots.py) keeps the claims these caps apply to."""

    # Kept by Slots: the claims held and sending, and the owners' shares.
    inflight: dict[int, tuple[Claim, float]]
    busy: dict[int, int]
    busy_owners: dict[str, int]
    sending: dict[int, int]
    started: dict[int, float]
    per_owner: int
    lone_owner: int

    def __init__(self, *, per_target: int, slow_after: float) -> None:
        self.per_target = max(1, per_target)  # the most any window may grow to
        self.initial = min(INITIAL_WINDOW, self.per_target)
        self.slow_after = slow_after
        self.degraded: set[int] = set()  # subscriptions held to one attempt in flight
        self.windows: dict[int, Window] = {}
        # The subscriptions whose window is not the initial one: the claim's shifted
        # counts need only these and the busy ones (not every window of thousands).
        self.resized: set[int] = set()
        self.fast_owners: dict[str, float] = {}  # owner -> when it last answered fast
        self.contended_at = float("-inf")  # when two owners last had work in flight
        self._forgot_at = 0.0
        self._now = 0.0

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
