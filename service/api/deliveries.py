"""The delivery log and recovery (SPEC section 7): a subscription's deliveries and their
attempts, redelivery of one, recovery of a window of failed ones, and test events.

Redeliver and recover run the SQL functions webhooks.redeliver and webhooks.recover
(sql/recovery.sql), the same ones the CLI and a DBA call. Scoping is the subscriptions':
another owner's or tenant's subscription, or a delivery of another subscription, is 404.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlencode

import msgspec
from litestar import Request, Response, get, post
from litestar.params import JSONBody, Parameter
from msgspec import UNSET, Meta, UnsetType

from service.api.auth import authenticated
from service.api.bodies import TIMESTAMP, Body
from service.api.deps import IdPath, PrincipalDep, StoreDep
from service.api.errors import ApiError, error_responses
from service.api.models import (
    check_single,
    parse_id,
    parse_limit,
    query_text,
    shown,
    timestamp,
)
from service.store import Store, StoreRejected
from service.tokens import Principal

DeliveryPath = Annotated[str, Parameter(description="delivery id (integer; the webhook-id "
                                                    "header of its attempts is msg_<id>)")]

STATUSES = ("pending", "succeeded", "failed")
# SQLSTATEs of sql/recovery.sql: unknown id, inactive subscription.
UNKNOWN, INACTIVE = "P0002", "55000"
_ERRORS = (400, 401, 404, 405, 413, 429, 503)
_REQUEUE_ERRORS = (*_ERRORS, 409)
_DOCS = {409: "the subscription is inactive: activate it (PUT active=true) first"}


class Delivery(msgspec.Struct):
    """A delivery as the API shows it."""

    id: int
    event: str
    event_id: int
    status: str
    attempts: int
    created_at: str
    next_attempt_at: str | None
    finished_at: str | None
    last_status: int | None


class Attempt(msgspec.Struct):
    """One HTTP attempt of a delivery; `status` 0 when no response came."""

    attempt: int
    attempted_at: str
    status: int
    duration_ms: float
    error: str | None


class DeliveryDetail(Delivery):
    """A delivery with the body as sent (parsed) and every attempt, oldest first."""

    payload: Any
    attempt_log: list[Attempt]


class Requeued(msgspec.Struct):
    """How many failed deliveries a recover queued again."""

    requeued: int


def to_delivery(row: dict[str, Any]) -> Delivery:
    """The API form of a deliveries_list / deliveries_get row."""
    return Delivery(id=row["id"], event=row["event"], event_id=row["event_id"],
                    status=row["status"], attempts=row["attempts"],
                    created_at=timestamp(row["created_at"]) or "",
                    next_attempt_at=timestamp(row["next_attempt_at"]),
                    finished_at=timestamp(row["finished_at"]), last_status=row["last_status"])


def to_detail(row: dict[str, Any], attempts: list[dict[str, Any]]) -> DeliveryDetail:
    """The single view: the delivery, its payload and its attempt log."""
    base = to_delivery(row)
    return DeliveryDetail(
        **{f: getattr(base, f) for f in Delivery.__struct_fields__},
        # The body exactly as it was sent (a number written 42.00 stays 42.00): the stored
        # text, embedded as it is.
        payload=msgspec.Raw(row["body"].encode() if isinstance(row["body"], str)
                            else row["body"]),
        attempt_log=[Attempt(attempt=a["attempt"],
                             attempted_at=timestamp(a["attempted_at"]) or "",
                             status=a["status"],
                             # Tenths of a millisecond: what a clock on either side means.
                             duration_ms=round(a["duration_ms"], 1), error=a["error"])
                     for a in attempts])


# --- parsing ------------------------------------------------------------------------

def parse_time(name: str, text: str) -> datetime:
    """An RFC 3339 timestamp with its offset, e.g. 2026-11-20T08:00:00Z; 400 otherwise."""
    problem = f"{name} must be {TIMESTAMP}, not {shown(text)}"
    if len(text) < 20 or text[10] not in "Tt ":
        raise ApiError(400, problem)
    try:
        value = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1] in "Zz" else text)
    except ValueError:
        raise ApiError(400, problem) from None
    if value.tzinfo is None:
        raise ApiError(400, problem)
    return value


def parse_before(text: str | None) -> int | None:
    """The `before` cursor: a delivery id (the Link header's next page)."""
    if text is None:
        return None
    number = parse_id(text)
    if number is None:
        raise ApiError(400, f"before must be a delivery id (a positive integer), not "
                            f"{shown(text)}")
    return number


def parse_status(text: str | None) -> str | None:
    """The `status` filter: pending, succeeded or failed."""
    if text is not None and text not in STATUSES:
        raise ApiError(400, f"status must be one of {', '.join(STATUSES)}, not {shown(text)}")
    return text


def _number(text: str, what: str) -> int:
    number = parse_id(text)
    if number is None:
        raise ApiError(404, f"no {what} with id {shown(text)}")
    return number


async def _subscription(store: Store, text: str, principal: Principal) -> dict[str, Any]:
    """The caller's subscription {"id", "active"}; 404 when it is not the caller's."""
    number = _number(text, "webhook")
    row = await store.delivery_subscription(id=number, owner=principal.owner,
                                            tenant=principal.tenant)
    if row is None:
        raise ApiError(404, f"no webhook with id {number}")
    return dict(row)


# Days of partitions made ahead of today, as the worker keeps them.
PARTITIONS_AHEAD = 2
# PostgreSQL's check_violation: an insert into a partitioned table found no partition for
# its row's day (no worker has run since that day began).
NO_PARTITION = "23514"


async def ensure_partitions(store: Store) -> None:
    """Makes today's partitions and the next days' (webhooks.ensure_partitions)."""
    await store.ensure_partitions(ahead=PARTITIONS_AHEAD)


def _inactive(subscription_id: int) -> ApiError:
    return ApiError(409, f"webhook {subscription_id} is inactive; activate it with PUT "
                         f"/api/v1/webhooks/{subscription_id} {{\"active\": true}} first")


def _requeue_error(exc: StoreRejected, subscription_id: int, what: str) -> ApiError:
    if exc.sqlstate == INACTIVE:
        return _inactive(subscription_id)
    if exc.sqlstate == UNKNOWN:
        return ApiError(404, f"no {what}")
    raise exc


class Recover(msgspec.Struct, forbid_unknown_fields=True):
    """The window of a recover: its failed deliveries created in [since, until)."""

    since: Annotated[datetime, Meta(
        tz=True, description="RFC 3339: failed deliveries created at or after this time are "
                             "queued again", examples=["2026-11-20T08:00:00Z"])]
    until: Annotated[datetime, Meta(tz=True, description="RFC 3339: and before this time "
                                    "(default: now)", examples=["2026-11-22T08:00:00Z"])
                     ] | UnsetType = UNSET


# --- routes -------------------------------------------------------------------------

LIST_PARAMS = ("status", "event", "since", "until", "limit", "before")


@get("/webhooks/{webhook_id:str}/deliveries", summary="List a subscription's deliveries",
     responses=error_responses(*_ERRORS, docs=_DOCS))
async def list_deliveries(
    webhook_id: IdPath,
    request: Request[Any, Any, Any],
    principal: PrincipalDep,
    store: StoreDep,
    status: Annotated[str | None, Parameter(description="pending, succeeded or failed")] = None,
    event: Annotated[str | None, Parameter(description="only this event name")] = None,
    since: Annotated[str | None, Parameter(
        description="RFC 3339: created at or after this time")] = None,
    until: Annotated[str | None, Parameter(description="RFC 3339: created before this time")
                     ] = None,
    limit: Annotated[str | None, Parameter(description="1 to 1000, default 100")] = None,
    before: Annotated[str | None, Parameter(
        description="only ids below this (the Link header's next page)")] = None,
) -> Response[list[Delivery]]:
    """The subscription's deliveries, newest first; a `Link: <...>; rel="next"` when more
    remain."""
    check_single(request.query_params.dict(), LIST_PARAMS)
    wanted = parse_limit(limit)
    status_ = parse_status(status)
    event_ = query_text("event", event)
    since_ = parse_time("since", since) if since is not None else None
    until_ = parse_time("until", until) if until is not None else None
    before_ = parse_before(before)
    sub = await _subscription(store, webhook_id, principal)
    rows = await store.list_deliveries(subscription_id=sub["id"], status=status_,
                                       event=event_, since=since_, until=until_,
                                       before=before_, limit=wanted + 1)
    page = [to_delivery(r) for r in rows[:wanted]]
    headers = {}
    if len(rows) > wanted:
        query = {k: v for k, v in (("status", status), ("event", event), ("since", since),
                                   ("until", until)) if v is not None}
        query.update(limit=str(wanted), before=str(page[-1].id))
        url = request.url.with_replacements(query=urlencode(query), fragment="")
        headers["Link"] = f'<{url}>; rel="next"'
    return Response(page, headers=headers)


@get("/webhooks/{webhook_id:str}/deliveries/{delivery_id:str}",
     summary="Get a delivery with its payload and attempts",
     responses=error_responses(*_ERRORS, docs=_DOCS))
async def get_delivery(webhook_id: IdPath, delivery_id: DeliveryPath, principal: PrincipalDep,
                       store: StoreDep) -> DeliveryDetail:
    """One delivery: the payload as sent and every attempt, oldest first."""
    number = _number(delivery_id, "delivery")
    sub = await _subscription(store, webhook_id, principal)
    async with store.transaction() as s:
        row = await s.get_delivery(id=number, subscription_id=sub["id"])
        if row is None:
            raise ApiError(404, f"no delivery with id {number} for webhook {sub['id']}")
        attempts = await s.delivery_attempts(id=number)
    return to_detail(row, attempts)


@post("/webhooks/{webhook_id:str}/deliveries/{delivery_id:str}/redeliver",
      summary="Queue a delivery again (same id), whatever its status", status_code=202,
      response_description="the delivery, pending and due now",
      responses=error_responses(*_REQUEUE_ERRORS, docs=_DOCS))
async def redeliver(webhook_id: IdPath, delivery_id: DeliveryPath, principal: PrincipalDep,
                    store: StoreDep) -> Delivery:
    """The delivery becomes pending and due now, keeping its id, with a fresh retry
    schedule; 409 while the subscription is inactive."""
    number = _number(delivery_id, "delivery")
    sub = await _subscription(store, webhook_id, principal)
    try:
        async with store.transaction() as s:
            if await s.get_delivery(id=number, subscription_id=sub["id"]) is None:
                raise ApiError(404, f"no delivery with id {number} for webhook {sub['id']}")
            await s.redeliver(id=number)
            row = await s.get_delivery(id=number, subscription_id=sub["id"])
            assert row is not None
    except StoreRejected as exc:
        raise _requeue_error(exc, sub["id"], f"delivery with id {number}") from None
    return to_delivery(row)


@post("/webhooks/{webhook_id:str}/recover",
      summary="Queue a window's failed deliveries again, in event order", status_code=202,
      dto=Body[Recover], return_dto=None, guards=[authenticated],
      response_description="how many were queued again",
      responses=error_responses(*_REQUEUE_ERRORS, docs=_DOCS))
async def recover(webhook_id: IdPath, data: JSONBody[Recover], principal: PrincipalDep,
                  store: StoreDep) -> Requeued:
    """Every failed delivery created in [since, until) becomes pending and due now, keeping
    its id; 409 while the subscription is inactive."""
    sub = await _subscription(store, webhook_id, principal)
    since, until = data.since, (None if isinstance(data.until, UnsetType) else data.until)
    if until is not None and until <= since:
        raise ApiError(400, "until must be later than since")
    try:
        requeued = await store.recover(subscription_id=sub["id"], since=since, until=until)
    except StoreRejected as exc:
        raise _requeue_error(exc, sub["id"], f"webhook with id {sub['id']}") from None
    return Requeued(requeued=requeued)


@post("/webhooks/{webhook_id:str}/test", summary="Send a webhook.test event", status_code=202,
      response_description="the delivery of the webhook.test event",
      responses=error_responses(*_REQUEUE_ERRORS, docs=_DOCS))
async def send_test(webhook_id: IdPath, principal: PrincipalDep, store: StoreDep) -> Delivery:
    """Queues a `webhook.test` event (resource "webhooks", resource_id the subscription id)
    and its one delivery to this subscription, signed and logged like any other; 409 while
    the subscription is inactive."""
    sub = await _subscription(store, webhook_id, principal)
    try:
        row = await _queue_test(store, sub["id"])
    except StoreRejected as exc:
        # The API may run while no worker has made today's partitions: make them, once.
        if exc.sqlstate != NO_PARTITION:
            raise
        await ensure_partitions(store)
        row = await _queue_test(store, sub["id"])
    return to_delivery(row)


async def _queue_test(store: Store, subscription_id: int) -> dict[str, Any]:
    async with store.transaction() as s:
        created = await s.queue_test_delivery(id=subscription_id)
        if created is None:
            raise _inactive(subscription_id)
        row = await s.get_delivery(id=created["id"], subscription_id=subscription_id)
    assert row is not None
    return dict(row)


class HourStats(msgspec.Struct):
    """A subscription's attempts in one hour (UTC): answered 2xx, answered otherwise, and
    with no answer (a timeout, a refused connection)."""

    hour: str
    succeeded: int
    failed: int
    unanswered: int


class Stats(msgspec.Struct):
    """Attempts per hour over the last `hours` hours, oldest first, every hour present."""

    hours: int
    buckets: list[HourStats]


MAX_STATS_HOURS = 168


@get("/webhooks/{webhook_id:str}/stats", summary="A subscription's attempts per hour",
     responses=error_responses(*_ERRORS, docs=_DOCS))
async def stats(
    webhook_id: IdPath,
    request: Request[Any, Any, Any],
    principal: PrincipalDep,
    store: StoreDep,
    hours: Annotated[str | None, Parameter(description="1 to 168, default 24")] = None,
) -> Stats:
    """How the subscription's attempts went, hour by hour (UTC), over the last `hours`
    hours: the dashboard's picture, for any client."""
    check_single(request.query_params.dict(), ("hours",))
    wanted = 24
    if hours is not None:
        if not hours.isascii() or not hours.isdigit() or not 1 <= int(hours) <= MAX_STATS_HOURS:
            raise ApiError(400, f"hours must be an integer from 1 to {MAX_STATS_HOURS}, not "
                                f"{shown(hours)}")
        wanted = int(hours)
    sub = await _subscription(store, webhook_id, principal)
    rows = await store.delivery_stats(id=sub["id"], hours=wanted)
    return Stats(hours=wanted, buckets=[HourStats(**r) for r in rows])


HANDLERS = [list_deliveries, get_delivery, redeliver, recover, send_test, stats]
