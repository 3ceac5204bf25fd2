"""Query parameters of the lists (service/api/models.py, service/api/deliveries.py): each
bad value is a 400 naming the parameter and what it must be. The API answers them through
HTTP in tests/e2e/test_delivery_log.py and tests/e2e/test_api_webhooks.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from service.api.deliveries import parse_before, parse_status, parse_time
from service.api.errors import ApiError
from service.api.models import (
    check_single,
    parse_active,
    parse_after,
    parse_id,
    parse_limit,
    query_text,
)


@pytest.mark.parametrize(("parse", "text", "message"), [
    (parse_limit, "0", "limit must be an integer from 1 to 1000, not '0'"),
    (parse_limit, "1001", "limit must be an integer from 1 to 1000, not '1001'"),
    (parse_limit, "-1", "limit must be an integer"),
    (parse_limit, "1e3", "limit must be an integer"),
    (parse_limit, "٣", "limit must be an integer"),  # a digit, but not an ASCII one
    (parse_after, "-1", "after must be a subscription id (a non-negative integer), not '-1'"),
    (parse_after, "9223372036854775808", "after must be a subscription id"),
    (parse_before, "-3", "before must be a delivery id (a positive integer), not '-3'"),
    (parse_before, "x", "before must be a delivery id"),
    (parse_before, "0", "before must be a delivery id"),
    (parse_status, "done", "status must be one of pending, succeeded, failed, not 'done'"),
    (parse_active, "yes", "active must be"),
])
def test_a_bad_value_names_the_parameter(parse: Callable[[str], Any], text: str,
                                         message: str) -> None:
    with pytest.raises(ApiError) as info:
        parse(text)
    assert info.value.status == 400
    assert info.value.message.startswith(message)


def test_left_out_parameters_take_their_defaults() -> None:
    assert (parse_limit(None), parse_after(None), parse_before(None), parse_status(None),
            parse_active(None)) == (100, 0, None, None, None)
    assert (parse_limit("1000"), parse_after("0"), parse_before("7"),
            parse_status("failed"), parse_active("false")) == (1000, 0, 7, "failed", False)


@pytest.mark.parametrize(("text", "expected"), [
    ("1", 1), ("9223372036854775807", 9223372036854775807), ("0", None), ("-1", None),
    ("9223372036854775808", None), ("01x", None), ("", None), ("\u0661", None),
])
def test_a_path_id_is_a_positive_bigint_or_none(text: str, expected: int | None) -> None:
    assert parse_id(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("yesterday", "since must be an RFC 3339 timestamp with a time zone, such as "
                  "2026-11-20T08:00:00Z, not 'yesterday'"),
    ("2026-01-01T00:00:00", "with a time zone"),
    ("2026-01-01", "RFC 3339 timestamp"),
    ("2026-13-01T00:00:00Z", "RFC 3339 timestamp"),
    ("2026-01-01X00:00:00Z", "RFC 3339 timestamp"),
    ("x" * 1000, "not '" + "x" * 60 + "...'"),
])
def test_a_bad_time_says_what_a_time_looks_like(text: str, message: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_time("since", text)
    assert info.value.status == 400 and message in info.value.message


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-20T08:00:00Z", datetime(2026, 11, 20, 8, tzinfo=UTC)),
    ("2026-11-20t08:00:00z", datetime(2026, 11, 20, 8, tzinfo=UTC)),
    ("2026-11-20 08:00:00.5+05:30",
     datetime(2026, 11, 20, 8, 0, 0, 500000, tzinfo=timezone(timedelta(hours=5, minutes=30)))),
])
def test_times_with_their_offsets_are_read(text: str, expected: datetime) -> None:
    assert parse_time("until", text) == expected


def test_a_parameter_given_twice_or_with_nul_is_refused() -> None:
    check_single({"status": ["failed"], "other": ["a", "b"]}, ("status", "event"))
    with pytest.raises(ApiError, match="query parameter 'status' is given more than once"):
        check_single({"status": ["failed", "pending"]}, ("status", "event"))
    assert query_text("event", "invoice.create") == "invoice.create"
    with pytest.raises(ApiError, match="query parameter 'event' must not contain NUL"):
        query_text("event", "a\x00b")
