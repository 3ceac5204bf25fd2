"""The API's request rate limit per token (service/api/ratelimit.py), on a clock the test
moves; over the API: tests/e2e/test_api_limits.py."""

from __future__ import annotations

import pytest

from service.api.ratelimit import RateLimiter, retry_after


def test_token_bucket() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    assert [limiter.acquire(1) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.acquire(1) == pytest.approx(0.5)
    assert limiter.acquire(2) == 0.0  # buckets are per key
    now[0] = 0.5
    assert limiter.acquire(1) == 0.0
    assert limiter.acquire(1) > 0
    now[0] = 100.0  # refills up to the burst, not beyond
    assert [limiter.acquire(1) for _ in range(4)][-1] > 0
    off = RateLimiter(rate=0.0, burst=1)
    assert all(off.acquire(1) == 0.0 for _ in range(1000))
    assert retry_after(0.01) == "1" and retry_after(2.2) == "3"
