"""A per-key token bucket: the API's request rate limit per token.

In-process by design: each API process keeps its own buckets, so with N processes behind a
load balancer a token may make up to N times the configured rate. Keys are token ids, never
tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class RateLimiter:
    """Allows `rate` requests per second per key, with bursts of up to `burst` requests."""

    def __init__(self, rate: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._clock = clock
        # key -> (tokens left, time of the last refill)
        self._buckets: dict[int, tuple[float, float]] = {}

    @property
    def enabled(self) -> bool:
        """False when the rate is 0 (no limit)."""
        return self.rate > 0

    def acquire(self, key: int) -> float:
        """Takes one request from the key's bucket: 0.0 when allowed, else the seconds to wait.

        A refused request takes nothing, so a client that waits the answer gets through.
        """
        if not self.enabled:
            return 0.0
        now = self._clock()
        tokens, last = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate


def retry_after(wait: float) -> str:
    """The Retry-After header value (whole seconds, at least 1) for a wait in seconds."""
    return str(max(1, math.ceil(wait)))
