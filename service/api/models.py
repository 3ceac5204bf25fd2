"""What the API reads and writes: request parsing with exact messages, response shapes.

Request bodies are parsed here from raw bytes rather than by Litestar, so that every
mistake gets a message naming the field and the problem, in the order the API promises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar.openapi.spec import (
    Components,
    OpenAPIMediaType,
    OpenAPIType,
    Operation,
    RequestBody,
    Schema,
    SecurityScheme,
)

from service.api.bodies import json_type, shown
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
        inactive_reason=row.get("inactive_reason"),
    )


def parse_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; 400 for an empty, malformed or non-object body."""
    if not raw.strip():
        raise ApiError(400, "request body is empty: send a JSON object")
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"request body must be a JSON object, not {json_type(value)}")
    return value


def check_fields(body: dict[str, Any], allowed: tuple[str, ...], required: tuple[str, ...]
                 ) -> None:
    """400 for the first unknown field, then for the first missing required one."""
    for name in body:
        if name not in allowed:
            raise ApiError(400, f"unknown field {shown(name)}; allowed fields: "
                                f"{', '.join(allowed)}")
    for name in required:
        if name not in body:
            raise ApiError(400, f"missing field {name!r}")


def string_field(body: dict[str, Any], name: str) -> str:
    """The field as a string without NUL characters (Postgres text cannot hold them)."""
    value = body[name]
    if not isinstance(value, str):
        raise ApiError(400, f"field {name!r} must be a string, not {json_type(value)}")
    if "\x00" in value:
        raise ApiError(400, f"field {name!r} must not contain NUL characters")
    return value


def events_field(body: dict[str, Any]) -> str:
    """`events` as the comma-separated text the registry parses: a string
    ("invoice.create,invoice.update") or an array of strings (["invoice.create", ...])."""
    value = body["events"]
    if not isinstance(value, list):
        if not isinstance(value, str):
            raise ApiError(400, "field 'events' must be a string or an array of strings, "
                                f"not {json_type(value)}")
        return string_field(body, "events")
    for item in value:
        if not isinstance(item, str):
            raise ApiError(400, "field 'events' must be an array of strings; it holds "
                                f"{json_type(item)}")
        if "," in item or "\x00" in item:
            raise ApiError(400, f"field 'events': each item names one event, not {shown(item)}")
    return ",".join(value)


def bool_field(body: dict[str, Any], name: str) -> bool:
    """The field as a JSON boolean (1 and "true" are not booleans)."""
    value = body[name]
    if not isinstance(value, bool):
        raise ApiError(400, f"field {name!r} must be true or false, not {json_type(value)}")
    return value


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


CREATE_FIELDS = ("resource", "events", "target")
CREATE_OPTIONAL = ("filter", "ordering", "rate_limit")
# A subscription's rate limit: POSTs per second (docs/api.md, "Rate limits").
RATE_LIMITS = (1, 10_000)
ORDERINGS = ("unordered", "strict")
UPDATE_FIELDS = ("active", "id", "resource", "events", "target", "last_status",
                 "last_success_at", "last_failure_at", "last_failure_content", "filter",
                 "ordering", "inactive_reason", "rate_limit")
# id, resource, events and target may be repeated in a PUT but not changed. The status
# fields, which the worker changes at any time, may be sent too (a client sending back what
# it read) and are ignored, since comparing them would race the worker.
STATUS_FIELDS = ("last_status", "last_success_at", "last_failure_at", "last_failure_content",
                 "inactive_reason")


def rate_limit_field(body: dict[str, Any]) -> int | None:
    """`rate_limit`: an integer from 1 to 10,000, or null for none."""
    value = body.get("rate_limit")
    low, high = RATE_LIMITS
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(400, f"field 'rate_limit' must be an integer from {low} to {high:,} "
                            f"(POSTs per second) or null, not {shown(str(value))}")
    return value


def check_unchanged(body: dict[str, Any], current: Subscription, names: list[str] | None
                    ) -> None:
    """400 naming the first fixed field whose value differs from the current one.

    `names` are the canonical events the body names, compared as a set with the stored ones.
    """
    if "id" in body:
        value = body["id"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(400, f"field 'id' must be an integer, not {json_type(value)}")
        if value != current.id:
            raise ApiError(400, "field 'id' cannot be changed")
    for name in ("resource",):
        if name in body and string_field(body, name) != getattr(current, name):
            raise ApiError(400, f"field {name!r} cannot be changed; create a new webhook "
                                "and delete this one instead")
    if names is not None and set(names) != set(current.events.split(",")):
        raise ApiError(400, "field 'events' cannot be changed; create a new webhook and "
                            "delete this one instead")
    if "filter" in body and body["filter"] != current.filter:
        raise ApiError(400, "field 'filter' cannot be changed; create a new webhook and "
                            "delete this one instead")
    if "ordering" in body and body["ordering"] != current.ordering:
        raise ApiError(400, "field 'ordering' cannot be changed; create a new webhook and "
                            "delete this one instead")
    for name in STATUS_FIELDS:
        value = body.get(name)
        wanted, kind = (int, "an integer") if name == "last_status" else (str, "a string")
        if value is not None and (isinstance(value, bool) or not isinstance(value, wanted)):
            raise ApiError(400, f"field {name!r} must be {kind} or null")


# OpenAPI: the request bodies are parsed by hand above, so their schemas are declared here.
_STRING = Schema(type=OpenAPIType.STRING)
EVENTS_SCHEMA = Schema(
    one_of=[Schema(type=OpenAPIType.STRING),
            Schema(type=OpenAPIType.ARRAY, items=Schema(type=OpenAPIType.STRING), min_items=1)],
    description="event names, comma-separated or as an array: full (invoice.create), bare "
                "verbs of the resource's own noun (create), destroy as an alias of delete",
    examples=["invoice.create,payment.create", ["invoice.create", "payment.create"]])
RATE_LIMIT_SCHEMA = Schema(
    one_of=[Schema(type=OpenAPIType.INTEGER, minimum=RATE_LIMITS[0], maximum=RATE_LIMITS[1]),
            Schema(type=OpenAPIType.NULL)],
    description="POSTs per second to the target at most, across every worker (first "
                "attempts, retries, redeliveries, test events, backfills); deliveries "
                "beyond it wait. null: no limit (the default)")
CREATE_SCHEMA = Schema(
    title="CreateSubscription",
    type=OpenAPIType.OBJECT,
    required=["resource", "events", "target"],
    additional_properties=False,
    properties={
        "resource": Schema(type=OpenAPIType.STRING, description="a resource of /hook_events",
                           examples=["invoices"]),
        "events": EVENTS_SCHEMA,
        "target": Schema(type=OpenAPIType.STRING,
                         description="http(s) URL that answers the verification POST with "
                                     "200 and the same X-Hook-Secret header",
                         examples=["https://example.com/hooks"]),
        "filter": Schema(
            one_of=[Schema(type=OpenAPIType.OBJECT), Schema(type=OpenAPIType.NULL)],
            description="conditions on the row, all of which must hold (SPEC section 9): "
                        "column: scalar (equality) or {op: value} with op one of eq, ne, "
                        "gt, gte, lt, lte, in, nin (arrays), exists (true/false); "
                        '"$changed": [columns] passes an update only when one changed',
            examples=[{"status": "paid", "amount": {"gte": 100}, "$changed": ["status"]}]),
        "ordering": Schema(type=OpenAPIType.STRING, enum=list(ORDERINGS),
                           description="strict: one delivery in flight at a time, in event "
                                       "order; default unordered"),
        "rate_limit": RATE_LIMIT_SCHEMA,
    },
)
UPDATE_SCHEMA = Schema(
    title="UpdateSubscription",
    type=OpenAPIType.OBJECT,
    additional_properties=False,
    description="active, target and/or rate_limit; a field left out keeps its value. A "
                "new target "
                "moves the subscription after the verification handshake with a newly made "
                "secret, which then signs (the old one beside it for the rotation overlap); "
                "id and log stay; id, resource and events may be sent with their current "
                "values; last_* fields are read-only and ignored.",
    properties={
        "active": Schema(type=OpenAPIType.BOOLEAN),
        "id": Schema(type=OpenAPIType.INTEGER),
        "resource": _STRING,
        "events": EVENTS_SCHEMA,
        "target": _STRING,
        "last_status": Schema(one_of=[Schema(type=OpenAPIType.INTEGER),
                                      Schema(type=OpenAPIType.NULL)]),
        "last_success_at": Schema(one_of=[_STRING, Schema(type=OpenAPIType.NULL)]),
        "last_failure_at": Schema(one_of=[_STRING, Schema(type=OpenAPIType.NULL)]),
        "last_failure_content": Schema(one_of=[_STRING, Schema(type=OpenAPIType.NULL)]),
        "filter": Schema(one_of=[Schema(type=OpenAPIType.OBJECT),
                                 Schema(type=OpenAPIType.NULL)]),
        "ordering": Schema(type=OpenAPIType.STRING, enum=list(ORDERINGS)),
        "rate_limit": RATE_LIMIT_SCHEMA,
    },
)
REQUEST_COMPONENTS = Components(
    security_schemes={"BearerToken": SecurityScheme(
        type="http", scheme="bearer",
        description="an API token from `webhooks token create`")},
)


def _body(schema: Schema) -> RequestBody:
    # Inline: Litestar rebuilds components/schemas from its own registry, dropping others.
    return RequestBody(required=True,
                       content={"application/json": OpenAPIMediaType(schema=schema)})


@dataclass
class CreateOperation(Operation):
    """An OpenAPI operation whose request body is CreateSubscription."""

    def __post_init__(self) -> None:
        self.request_body = _body(CREATE_SCHEMA)


@dataclass
class UpdateOperation(Operation):
    """An OpenAPI operation whose request body is UpdateSubscription."""

    def __post_init__(self) -> None:
        self.request_body = _body(UPDATE_SCHEMA)
