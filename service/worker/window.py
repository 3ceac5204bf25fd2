"""A subscription's adaptive window of deliveries in flight (caps.py adapts it)."""

from __future__ import annotations

from dataclasses import dataclass

# Where a subscription's window starts (and where it returns once forgotten).
INITIAL_WINDOW = 2
# An answer is fast when it takes at most FAST_FACTOR times the fastest the target has
# recently answered, plus FAST_SLACK_MS, and less than half of the slow mark.
FAST_FACTOR = 2.0
FAST_SLACK_MS = 5.0
# An attempt in flight longer than `slow_after`, or than SLOW_FACTOR times the fastest its
# target has recently answered when that is longer, marks the subscription degraded: a
# target that always takes 1.5 s to answer 2xx is slow, not hanging, and was held to one
# request at a time (0.67 deliveries/s: two hours for 5,000).
SLOW_FACTOR = 4.0
# A window (and an owner's record of fast answers) unused this long is forgotten.
FORGET_AFTER = 60.0


@dataclass(slots=True)
class Window:
    """A subscription's adaptive window of deliveries in flight."""

    size: float
    threshold: float  # below it the window grows by one per fast answer (slow start)
    base_ms: float = float("inf")  # the fastest recent answer, drifting up slowly
    used_at: float = 0.0
    # Size and threshold before an attempt in flight past the slow mark halved the window
    # (slow_mark): a 2xx answer after all undoes that (a slow target, not a hanging one).
    before_slow: tuple[float, float] | None = None

    def fast(self, duration_ms: float, slow_ms: float) -> bool:
        """Whether an answer that took `duration_ms` counts as fast (and updates the base)."""
        if duration_ms < self.base_ms:
            self.base_ms = duration_ms
        else:
            self.base_ms += (duration_ms - self.base_ms) / 64.0
        return (duration_ms <= FAST_FACTOR * self.base_ms + FAST_SLACK_MS
                and duration_ms < slow_ms / 2)

    def grow(self, maximum: int) -> None:
        """One fast 2xx answer while the window was in use."""
        step = 1.0 if self.size < self.threshold else 1.0 / self.size
        self.size = min(float(maximum), self.size + step)

    def grow_slowly(self, maximum: int) -> None:
        """One 2xx answer, quick for its target but not fast (over half the slow mark):
        growth by about one per window of such answers."""
        self.size = min(float(maximum), self.size + 1.0 / self.size)

    def shrink(self) -> None:
        """Trouble: half the window, and growth by one per window from there."""
        self.before_slow = None
        self.size = max(1.0, self.size / 2.0)
        self.threshold = self.size

    def slow_mark(self) -> None:
        """An attempt is in flight past the slow mark: shrink(), undone by a 2xx answer
        (answered_after_slow): the first answers of a target that always takes a second
        came just past the mark and halved its window for nothing (20,000 deliveries to
        500 such subscriptions reached 1,500 in flight after 12 s instead of 3)."""
        before = (self.size, self.threshold)
        self.shrink()
        self.before_slow = before

    def answered_after_slow(self) -> None:
        """A 2xx answer: the window is back where a slow mark found it."""
        if self.before_slow is not None:
            size, threshold = self.before_slow
            self.size, self.threshold = max(self.size, size), max(self.threshold, threshold)
            self.before_slow = None
