"""When to try a failed delivery again: the retry schedule, jitter and Retry-After."""

from __future__ import annotations

import random
from email.utils import parsedate_to_datetime

from service.outcomes import classify

# Spread retries of deliveries that failed together (a target that was down), so they do
# not come back as one burst.
JITTER = 0.1

# A Retry-After longer than this is not a value any server means; it is ignored.
MAX_RETRY_AFTER_CHARS = 64


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait asked by a Retry-After header (delay-seconds or HTTP-date), or None.

    A target controls this text: anything that is not a well-formed value (other digits
    than ASCII ones, a negative number, a date out of range, bytes that are not text) is
    None, and the retry schedule applies. It never raises.
    """
    if value is None:
        return None
    text = value.strip()
    if not text or len(text) > MAX_RETRY_AFTER_CHARS or not text.isascii():
        return None
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
        if when is None or when.tzinfo is None:
            return None
        return max(0.0, when.timestamp() - now)
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None


def scheduled_delay(schedule: tuple[float, ...], attempts: int,
                    rand: random.Random | None = None) -> float | None:
    """The delay before the next try after `attempts` tries, with jitter; None when exhausted."""
    if attempts < 1 or attempts > len(schedule):
        return None
    base = schedule[attempts - 1]
    uniform = (rand or random).uniform
    return max(0.0, base * (1.0 + uniform(-JITTER, JITTER)))


def next_delay(schedule: tuple[float, ...], attempts: int, *, status: int,
               retry_after: str | None, cap: float, now: float,
               rand: random.Random | None = None) -> float | None:
    """Seconds until the next try of a failed attempt, or None when the delivery has failed.

    A Retry-After on 429 or 503 wins when it asks for later than the schedule, up to `cap`.
    """
    delay = scheduled_delay(schedule, attempts, rand)
    if delay is None:
        return None
    if classify(status).honours_retry_after:
        asked = parse_retry_after(retry_after, now)
        if asked is not None and asked > delay:
            delay = max(delay, min(asked, cap))
    return delay
