"""Backfill: deliver every current row of a subscription's tables as
`<noun>.snapshot` events through the normal queue, and follow its progress.

The API only starts a backfill (webhooks.start_backfill, sql/backfill.sql); the workers
run it in short batches. Scoping is the subscriptions': another owner's or tenant's
subscription, or a backfill of another subscription, is 404.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Response, get, post
from litestar.params import JSONBody, Parameter

from service.api.auth import authenticated
from service.api.bodies import Body
from service.api.deliveries import _subscription
from service.api.deps import IdPath, PrincipalDep, SettingsDep, StoreDep
from service.api.errors import ApiError, error_responses
from service.api.models import parse_id, parse_limit, shown
from service.store import StoreRejected

BackfillPath = Annotated[str, Parameter(description="backfill id (integer)")]

# SQLSTATEs of sql/backfill.sql: unknown subscription, inactive, one running, nothing to
# backfill or a table that cannot be, the owner's limit of running backfills.
UNKNOWN, INACTIVE, RUNNING, INVALID, LIMIT = "P0002", "55000", "55006", "22023", "54000"
_ERRORS = (400, 401, 404, 405, 413, 429, 503)
_DOCS = {
    400: "the body is not {}, the subscription has no events of an attached table, or a "
         "table cannot be backfilled (its id column's type is not built into PostgreSQL)",
    409: "the subscription is inactive (activate it first), a backfill of it is still "
         "running, or its owner already runs WEBHOOKS_MAX_BACKFILLS_PER_OWNER backfills",
}


class BackfillTable(msgspec.Struct):
    """Progress of one table: snapshots queued, rows read (rows the filter leaves out are
    read, not queued), and whether every row was read."""

    resource: str
    rows: int
    scanned: int
    done: bool


class Backfill(msgspec.Struct):
    """A backfill: `rows` snapshots queued so far (each delivered through the normal queue,
    and visible in the delivery log as `<noun>.snapshot`)."""

    id: int
    webhook_id: int
    status: str
    rows: int
    created_at: str
    updated_at: str
    finished_at: str | None
    error: str | None
    tables: list[BackfillTable]


class BackfillStarted(msgspec.Struct):
    """A backfill just started."""

    id: int
    status: str


class BackfillRequest(msgspec.Struct, forbid_unknown_fields=True):
    """An empty object: every current row of the subscription's tables is delivered, with
    its tenant scope, excluded columns and filter."""


def _decode(text: str) -> Backfill:
    return msgspec.json.decode(text, type=Backfill)


@post("/webhooks/{webhook_id:str}/backfill",
      summary="Deliver every current row as <noun>.snapshot", status_code=202,
      dto=Body[BackfillRequest], return_dto=None, guards=[authenticated],
      response_description="the backfill, running",
      responses=error_responses(*_ERRORS, 409, docs=_DOCS))
async def start_backfill(webhook_id: IdPath, data: JSONBody[BackfillRequest],
                         principal: PrincipalDep, store: StoreDep,
                         settings: SettingsDep) -> BackfillStarted:
    """Starts delivering every current row of the attached tables whose events the
    subscription has, as `<noun>.snapshot` events in id order, with the subscription's
    tenant scope, excluded columns and filter; follow it with GET .../backfills/{id}.
    409 while the subscription is inactive, a backfill of it is running, or its owner
    runs as many backfills as it may (WEBHOOKS_MAX_BACKFILLS_PER_OWNER)."""
    sub = await _subscription(store, webhook_id, principal)
    # A table turned into something else (a view, a foreign partition, no key) since it
    # was attached is forgotten here, in a transaction of its own, and nothing is read.
    problem = await store.unreadable_table(subscription_id=sub["id"])
    if problem is not None:
        raise ApiError(400, f"cannot backfill: {problem}; the table was detached")
    try:
        row = await store.start_backfill(subscription_id=sub["id"],
                                         max_per_owner=settings.max_backfills_per_owner)
    except StoreRejected as exc:
        if exc.sqlstate == INACTIVE:
            raise ApiError(409, f"webhook {sub['id']} is inactive; activate it with PUT "
                                f"/api/v1/webhooks/{sub['id']} {{\"active\": true}} "
                                "first") from None
        if exc.sqlstate == RUNNING:
            raise ApiError(409, f"{_message(exc)}; follow it with GET "
                                f"/api/v1/webhooks/{sub['id']}/backfills") from None
        if exc.sqlstate == LIMIT:
            raise ApiError(409, f"{_message(exc)} (WEBHOOKS_MAX_BACKFILLS_PER_OWNER)") from None
        if exc.sqlstate == INVALID:
            raise ApiError(400, _message(exc)) from None
        if exc.sqlstate == UNKNOWN:
            raise ApiError(404, f"no webhook with id {sub['id']}") from None
        raise
    return BackfillStarted(id=row["id"], status="running")


def _message(exc: StoreRejected) -> str:
    """PostgreSQL's message alone (the first line, without psycopg's decorations)."""
    return str(exc).splitlines()[0].strip()


@get("/webhooks/{webhook_id:str}/backfills/{backfill_id:str}",
     summary="Get a backfill's progress", responses=error_responses(*_ERRORS))
async def get_backfill(webhook_id: IdPath, backfill_id: BackfillPath, principal: PrincipalDep,
                       store: StoreDep) -> Backfill:
    """`status` running, done or failed (`error` says why), `rows` snapshots queued so
    far, and each table's progress."""
    number = parse_id(backfill_id)
    if number is None:
        raise ApiError(404, f"no backfill with id {shown(backfill_id)}")
    sub = await _subscription(store, webhook_id, principal)
    row = await store.get_backfill(id=number, subscription_id=sub["id"])
    if row is None:
        raise ApiError(404, f"no backfill with id {number} for webhook {sub['id']}")
    return _decode(row["body"])


@get("/webhooks/{webhook_id:str}/backfills", summary="List a subscription's backfills",
     responses=error_responses(*_ERRORS))
async def list_backfills(
    webhook_id: IdPath, principal: PrincipalDep, store: StoreDep,
    limit: Annotated[str | None, Parameter(description="1 to 1000, default 100")] = None,
) -> Response[list[Backfill]]:
    """The subscription's backfills, newest first."""
    wanted = parse_limit(limit)
    sub = await _subscription(store, webhook_id, principal)
    rows = await store.list_backfills(subscription_id=sub["id"], limit=wanted)
    return Response([_decode(r["body"]) for r in rows])


HANDLERS = [start_backfill, get_backfill, list_backfills]
