"""Retry schedules, jitter and Retry-After parsing (pure functions)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.worker.retry import JITTER, next_delay, parse_retry_after, scheduled_delay

SCHEDULE = (5.0, 300.0, 1800.0)
NOW = 1_700_000_000.0


@pytest.mark.parametrize("attempts, base", [(1, 5.0), (2, 300.0), (3, 1800.0)])
def test_schedule_step_with_jitter(attempts: int, base: float) -> None:
    rand = random.Random(attempts)
    for _ in range(200):
        delay = scheduled_delay(SCHEDULE, attempts, rand)
        assert delay is not None
        assert base * (1 - JITTER) <= delay <= base * (1 + JITTER)


def test_jitter_spreads_retries() -> None:
    rand = random.Random(1)
    delays = {scheduled_delay(SCHEDULE, 1, rand) for _ in range(20)}
    assert len(delays) > 10


@pytest.mark.parametrize("attempts", [0, 4, 10])
def test_exhausted_schedule_means_failed(attempts: int) -> None:
    assert scheduled_delay(SCHEDULE, attempts) is None
    assert next_delay(SCHEDULE, attempts, status=503, retry_after="5", cap=3600,
                      now=NOW) is None


def test_retry_after_seconds_and_dates() -> None:
    assert parse_retry_after("120", NOW) == 120.0
    when = format_datetime(datetime.fromtimestamp(NOW + 90, UTC), usegmt=True)
    assert parse_retry_after(when, NOW) == pytest.approx(90.0)
    past = format_datetime(datetime.fromtimestamp(NOW - 90, UTC), usegmt=True)
    assert parse_retry_after(past, NOW) == 0.0
    for bad in (None, "", "soon", "-5", "1.5e3", "Mon, 99 Foo 2020"):
        assert parse_retry_after(bad, NOW) is None


def test_retry_after_wins_only_when_later_on_429_and_503() -> None:
    rand = random.Random(0)
    assert next_delay(SCHEDULE, 1, status=429, retry_after="60", cap=3600, now=NOW,
                      rand=rand) == 60.0
    assert next_delay(SCHEDULE, 1, status=503, retry_after="60", cap=3600, now=NOW,
                      rand=rand) == 60.0
    # Earlier than the schedule: the schedule stands.
    delay = next_delay(SCHEDULE, 2, status=503, retry_after="1", cap=3600, now=NOW, rand=rand)
    assert delay is not None and delay >= 300 * (1 - JITTER)
    # Other statuses ignore it.
    delay = next_delay(SCHEDULE, 1, status=500, retry_after="60", cap=3600, now=NOW, rand=rand)
    assert delay is not None and delay < 6


def test_retry_after_is_capped() -> None:
    assert next_delay(SCHEDULE, 1, status=429, retry_after="999999", cap=600, now=NOW,
                      rand=random.Random(0)) == 600.0


MALFORMED_RETRY_AFTER = [
    "\u00b2", "1\u00b3", "\u2460", "\u0661\u0662", "\uff11\uff12",  # digits, not ASCII ones
    "Fri, 31 Dec 99999999999999999999 23:59:59 GMT",  # a year past any C long
    "Sat, 01 Jan 100000000000000000000000 00:00:00 +0000",
    "Fri, 31 Dec 99999 23:59:59 GMT", "Wed, 21 Oct 2015 07:28:00 +9999",
    "Fri, 31 Dec 9999 23:59:59 -9999", "-1", "+5", "0x10", "1_000", "nan", "inf",
    "9" * 5000, "\udcb2", "\x00", "1\x00", "garbage \u2603", " \t ",
]


@pytest.mark.parametrize("value", MALFORMED_RETRY_AFTER)
def test_malformed_retry_after_is_ignored(value: str) -> None:
    assert parse_retry_after(value, NOW) is None
    for status in (429, 503):
        delay = next_delay(SCHEDULE, 1, status=status, retry_after=value, cap=3600, now=NOW,
                           rand=random.Random(0))
        assert delay is not None and delay <= 5 * (1 + JITTER)


@given(st.text(max_size=80))
@settings(max_examples=500)
def test_retry_after_never_raises(value: str) -> None:
    asked = parse_retry_after(value, NOW)
    assert asked is None or asked >= 0.0
    delay = next_delay(SCHEDULE, 1, status=429, retry_after=value, cap=3600, now=NOW)
    assert delay is not None and 0.0 <= delay <= 3600
