"""What the API reads and writes: the request bodies of the subscriptions (declared types,
decoded by service.api.bodies.Body), query and path parameters parsed with exact
messages, and the response shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
from litestar.openapi.spec import Components, SecurityScheme
from msgspec import UNSET, Meta, UnsetType

from service.api.bodies import EventName, Text, shown
from service.api.errors import ApiError
from service.events import format_events

BIGINT_MAX = 2**63 - 1
MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
_DIGITS = re.compile(r"^[0-9]{1,19}$")


class Subscription(msgspec.Struct):
    """A subscription as the API shows it; never its secret or creation time."""

    id: int
    resource: str
    events: str
    target: str
    active: bool
    last_status: int | None
    last_success_at: str | None
    last_failure_at: str | None
    last_failure_content: str | None
    filter: dict[str, Any] | None = None
    ordering: str = "unordered"
    # Why the service made it inactive (its table detached, its events made private,
    # auto-disabled); null while active or when its owner deactivated it.
    inactive_reason: str | None = None
    # POSTs per second to the target at most, across every worker; left out when none.
    rate_limit: int | None = None


class HookEvent(msgspec.Struct):
    """One subscribable event of a resource."""

    resource: str
    event: str
    # The JSON Schema (2020-12) of its delivery body, from the table as it is now
    # (service.api.schemas).
    schema: dict[str, Any] = msgspec.field(default_factory=dict)


def timestamp(value: datetime | None) -> str | None:
    """RFC 3339 in UTC with microseconds, e.g. 2026-11-22T02:24:11.876540Z."""
    if value is None:
        return None
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def to_subscription(row: dict[str, Any]) -> Subscription:
    """The API form of a subscriptions row."""
    return Subscription(
        id=row["id"], resource=row["resource"], events=format_events(row["events"]),
        target=row["target"], active=row["active"], last_status=row["last_status"],
        last_success_at=timestamp(row["last_success_at"]),
        last_failure_at=timestamp(row["last_failure_at"]),
        last_failure_content=row["last_failure_content"],
        filter=row.get("filter"), ordering=row.get("ordering", "unordered"),
        inactive_reason=row.get("inactive_reason"), rate_limit=row.get("rate_limit"),
    )


def query_text(name: str, value: str | None) -> str | None:
    """A query parameter that Postgres can hold."""
    if value is not None and "\x00" in value:
        raise ApiError(400, f"query parameter {name!r} must not contain NUL characters")
    return value


def check_single(params: Mapping[str, list[str]], names: tuple[str, ...]) -> None:
    """400 when one of the named query parameters is given more than once (which one would
    count is a guess, so none does)."""
    for name in names:
        if len(params.get(name, ())) > 1:
            raise ApiError(400, f"query parameter {name!r} is given more than once")


def parse_id(text: str) -> int | None:
    """The subscription id in a path, or None when it cannot be one (the caller answers 404)."""
    if not _DIGITS.match(text):
        return None
    number = int(text)
    return number if 0 < number <= BIGINT_MAX else None


def parse_limit(text: str | None) -> int:
    """The `limit` query parameter: 1 to MAX_LIMIT, default DEFAULT_LIMIT."""
    if text is None:
        return DEFAULT_LIMIT
    if not _DIGITS.match(text) or not 1 <= int(text) <= MAX_LIMIT:
        raise ApiError(400, f"limit must be an integer from 1 to {MAX_LIMIT}, not {shown(text)}")
    return int(text)


def parse_after(text: str | None) -> int:
    """The `after` query parameter: a subscription id, default 0 (from the start)."""
    if text is None:
        return 0
    if not _DIGITS.match(text) or int(text) > BIGINT_MAX:
        raise ApiError(400, f"after must be a subscription id (a non-negative integer), "
                            f"not {shown(text)}")
    return int(text)


def parse_active(text: str | None) -> bool | None:
    """The `active` filter: true, false or absent."""
    if text is None:
        return None
    if text not in ("true", "false"):
        raise ApiError(400, f"active must be true or false, not {shown(text)}")
    return text == "true"


# A subscription's rate limit: POSTs per second (docs/api.md, "Rate limits").
RATE_LIMITS = (1, 10_000)
Ordering = Annotated[Literal["unordered", "strict"], Meta(
    description="strict: one delivery in flight at a time, in event order; default unordered")]
Events = Annotated[Text | Annotated[list[EventName], Meta(min_length=1)], Meta(
    description="event names, comma-separated or as an array: full (invoice.create), bare "
                "verbs of the resource's own noun (create), destroy as an alias of delete; "
                "an array holds at least one name, none with a comma",
    examples=["invoice.create,payment.create", ["invoice.create", "payment.create"]])]
Filter = Annotated[dict[str, Any], Meta(
    description="conditions on the row, all of which must hold (SPEC section 9): column: "
                "scalar (equality) or {op: value} with op one of eq, ne, gt, gte, lt, lte, in, "
                'nin (arrays), exists (true/false); "$changed": [columns] passes an update '
                "only when one changed",
    examples=[{"status": "paid", "amount": {"gte": 100}, "$changed": ["status"]}])]
RateLimit = Annotated[int, Meta(
    ge=RATE_LIMITS[0], le=RATE_LIMITS[1],
    description="POSTs per second to the target at most, across every worker (first attempts, "
                "retries, redeliveries, test events, backfills); deliveries beyond it wait. "
                "null: no limit (the default)")]


class CreateSubscription(msgspec.Struct, forbid_unknown_fields=True):
    """A new subscription: a resource's events, the target they are POSTed to, and
    optionally a filter, an ordering and a rate limit."""

    resource: Annotated[Text, Meta(description="a resource of /hook_events",
                                   examples=["invoices"])]
    events: Events
    target: Annotated[Text, Meta(
        description="http(s) URL that answers the verification POST with 200 and the same "
                    "X-Hook-Secret header", examples=["https://example.com/hooks"])]
    filter: Filter | None = None
    ordering: Ordering = "unordered"
    rate_limit: RateLimit | None = None


class UpdateSubscription(msgspec.Struct, forbid_unknown_fields=True):
    """active, target and/or rate_limit; a field left out keeps its value. A new target
    moves the subscription after the verification handshake with a newly made secret, which
    then signs (the old one beside it for the rotation overlap); id and log stay. id,
    resource, events, filter and ordering may be sent with their current values; the last_*
    fields and inactive_reason are read-only and ignored (a client may send back what it
    read)."""

    active: bool | UnsetType = UNSET
    id: int | UnsetType = UNSET
    resource: Text | UnsetType = UNSET
    events: Events | UnsetType = UNSET
    target: Text | UnsetType = UNSET
    # The status fields, which the worker changes at any time, are checked for their type
    # only: comparing them would race the worker.
    last_status: int | UnsetType | None = UNSET
    last_success_at: str | UnsetType | None = UNSET
    last_failure_at: str | UnsetType | None = UNSET
    last_failure_content: str | UnsetType | None = UNSET
    filter: Filter | UnsetType | None = UNSET
    ordering: Ordering | UnsetType = UNSET
    inactive_reason: str | UnsetType | None = UNSET
    rate_limit: RateLimit | UnsetType | None = UNSET


def events_text(events: str | list[str]) -> str:
    """`events` as the comma-separated text the registry parses: the string as it is, or
    the array's names joined."""
    return events if isinstance(events, str) else ",".join(events)


def check_unchanged(body: UpdateSubscription, current: Subscription, names: list[str] | None
                    ) -> None:
    """400 naming the first fixed field whose value differs from the current one.

    `names` are the canonical events the body names, compared as a set with the stored ones.
    """
    if not isinstance(body.id, UnsetType) and body.id != current.id:
        raise ApiError(400, "field 'id' cannot be changed")
    fixed = [("resource", body.resource, current.resource),
             ("events", UNSET if names is None else set(names), set(current.events.split(","))),
             ("filter", body.filter, current.filter), ("ordering", body.ordering, current.ordering)]
    for name, value, stored in fixed:
        if not isinstance(value, UnsetType) and value != stored:
            raise ApiError(400, f"field {name!r} cannot be changed; create a new webhook and "
                                "delete this one instead")


REQUEST_COMPONENTS = Components(
    security_schemes={"BearerToken": SecurityScheme(
        type="http", scheme="bearer",
        description="an API token from `webhooks token create`")},
)
