"""Request bodies, decoded as their declared types: what a client got wrong is one message
naming the field and the problem (service/api/bodies.py's `refusal`). The API answers it as
a 400: tests/e2e/test_api_errors.py shows a few of these through HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import msgspec
import pytest

from service.api.backfills import BackfillRequest
from service.api.bodies import BodyRefused, refusal
from service.api.deliveries import Recover
from service.api.models import CreateSubscription, UpdateSubscription

BODIES = [CreateSubscription, UpdateSubscription, Recover, BackfillRequest]


def refused(body_type: type[msgspec.Struct], raw: bytes) -> str:
    """The message for `raw` as a `body_type`; fails the test if it decodes."""
    try:
        msgspec.json.decode(raw, type=body_type)
    except (msgspec.DecodeError, RecursionError) as exc:
        return refusal(BodyRefused(body_type, raw, exc))
    raise AssertionError(f"{raw!r} decoded as a {body_type.__name__}")


@pytest.mark.parametrize("body_type", BODIES)
@pytest.mark.parametrize(("raw", "fragment"), [
    (b"", "request body is empty"), (b"   ", "request body is empty"),
    (b"{", "not valid JSON"), (b"{'a': 1}", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object, not an array"), (b'"text"', "not a string"),
    (b"null", "not null"), (b"42", "not a number"), (b"true", "not a boolean"),
    (b"\xff\xfe{}", "not valid JSON"), (b'{"resource": "inv\xe9oices"}', "not valid JSON"),
    (b"[" * 20000 + b"]" * 20000, "JSON"), (b"NaN", "not valid JSON"),
])
def test_a_body_that_is_not_an_object_says_so(body_type: type[msgspec.Struct], raw: bytes,
                                              fragment: str) -> None:
    assert fragment in refused(body_type, raw)


GOOD = {"resource": "invoices", "events": "create", "target": "https://example.com/hook"}


@pytest.mark.parametrize(("body", "message"), [
    ({"resource": "invoices", "target": "https://example.com/hook"},
     "missing field 'events'"),
    ({}, "missing field 'resource'"),
    ({**GOOD, "active": True},
     "unknown field 'active'; allowed fields: resource, events, target, filter, ordering, "
     "rate_limit"),
    ({**GOOD, "secret": "whsec_abc"}, "unknown field 'secret'"),
    ({**GOOD, "x" * 100: 1}, "unknown field '" + "x" * 60 + "...'"),
    ({**GOOD, "events": [1]},
     "field 'events' must be an array of strings; it holds a number"),
    ({**GOOD, "events": None},
     "field 'events' must be a string or an array of strings, not null"),
    ({**GOOD, "events": []}, "field 'events' must hold at least one item"),
    ({**GOOD, "events": ["create", "update,delete"]},
     "field 'events': each item names one event, not 'update,delete'"),
    ({**GOOD, "resource": 1}, "field 'resource' must be a string, not a number"),
    ({**GOOD, "target": {"url": "x"}}, "field 'target' must be a string, not an object"),
    ({**GOOD, "target": True}, "field 'target' must be a string, not a boolean"),
    ({**GOOD, "resource": "invoices\x00"},
     "field 'resource' must not contain NUL characters"),
    ({**GOOD, "events": "create\x00"}, "field 'events' must not contain NUL characters"),
    ({**GOOD, "ordering": "sorted"},
     "field 'ordering' must be one of strict, unordered, not 'sorted'"),
    ({**GOOD, "rate_limit": 0}, "field 'rate_limit' must be an integer from 1"),
    ({**GOOD, "rate_limit": "20"}, "field 'rate_limit' must be an integer from 1"),
    ({**GOOD, "filter": []}, "field 'filter' must be an object or null, not an array"),
])
def test_a_field_error_names_the_field_and_the_problem(body: dict[str, object],
                                                       message: str) -> None:
    assert refused(CreateSubscription, msgspec.json.encode(body)).startswith(message)


@pytest.mark.parametrize(("body", "message"), [
    ({"active": "false"}, "field 'active' must be true or false, not a string"),
    ({"active": 1}, "field 'active' must be true or false, not a number"),
    ({"target": None}, "field 'target' must be a string, not null"),
    ({"owner": "bob"}, "unknown field 'owner'; allowed fields: active, id, resource"),
])
def test_an_update_is_checked_field_by_field(body: dict[str, object], message: str) -> None:
    assert refused(UpdateSubscription, msgspec.json.encode(body)).startswith(message)


TIMESTAMP = "an RFC 3339 timestamp with a time zone, such as 2026-11-20T08:00:00Z"


@pytest.mark.parametrize(("raw", "message"), [
    (b"{}", "missing field 'since'"),
    (b'{"until": "2026-11-20T08:00:00Z"}', "missing field 'since'"),
    (b'{"since": "monday"}', f"field 'since' must be {TIMESTAMP}, not 'monday'"),
    (b'{"since": "2026-11-20"}', f"field 'since' must be {TIMESTAMP}, not '2026-11-20'"),
    # Without its offset, a time means a different instant on every server.
    (b'{"since": "2026-11-20T08:00:00"}', f"field 'since' must be {TIMESTAMP}"),
    (b'{"since": "2026-02-30T08:00:00Z"}', f"field 'since' must be {TIMESTAMP}"),
    (b'{"since": 1763625600}', f"field 'since' must be {TIMESTAMP}, not a number"),
    (b'{"since": null}', f"field 'since' must be {TIMESTAMP}, not null"),
    (b'{"since": "2026-11-20T08:00:00Z", "until": "x\\u0000"}',
     f"field 'until' must be {TIMESTAMP}, not 'x\\x00'"),
    (b'{"since": "2026-11-20T08:00:00Z", "status": "failed"}',
     "unknown field 'status'; allowed fields: since, until"),
])
def test_recover_takes_a_window_of_timestamps_with_their_offsets(raw: bytes,
                                                                 message: str) -> None:
    assert refused(Recover, raw).startswith(message)


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-20T08:00:00Z", datetime(2026, 11, 20, 8, tzinfo=UTC)),
    ("2026-11-20t08:00:00z", datetime(2026, 11, 20, 8, tzinfo=UTC)),
    ("2026-11-20 09:30:00+01:30",
     datetime(2026, 11, 20, 9, 30, tzinfo=timezone(timedelta(hours=1, minutes=30)))),
    ("2026-11-20T08:00:00.25-05:00",
     datetime(2026, 11, 20, 8, 0, 0, 250000, tzinfo=timezone(timedelta(hours=-5)))),
])
def test_recover_reads_each_form_of_rfc_3339(text: str, expected: datetime) -> None:
    window = msgspec.json.decode(f'{{"since": "{text}"}}'.encode(), type=Recover)
    assert window.since == expected
    assert window.since.utcoffset() == expected.utcoffset()


def test_a_backfill_takes_no_field() -> None:
    assert refused(BackfillRequest, b'{"tables": ["invoices"]}') == \
        "unknown field 'tables': this request takes no fields, send {}"
    assert msgspec.json.decode(b"{}", type=BackfillRequest) == BackfillRequest()
