"""Routes of the subscriptions resource (/api/v1/webhooks) and the hook-events registry:
list, create (after the verification handshake), get, activate or deactivate, delete."""

from __future__ import annotations

from typing import Annotated, Any, cast
from urllib.parse import urlencode

from litestar import MediaType, Request, Response, delete, get, post, put
from litestar.datastructures import State
from litestar.params import JSONBody, Parameter
from msgspec import UnsetType
from psycopg_pool import AsyncConnectionPool

from service import events
from service.api import schemas
from service.api.auth import admitted_read, authenticated, provide_principal
from service.api.bodies import Body
from service.api.checks import (
    allowed_target,
    canonical_events,
    check_filter_budget,
    checked_filter,
    move_target,
    settle,
    too_many,
    verified_secret,
)
from service.api.deps import (
    BoxDep,
    ClientDep,
    IdPath,
    MetricsDep,
    PrincipalDep,
    SettingsDep,
    StoreDep,
)
from service.api.errors import ApiError, error_responses
from service.api.models import (
    CreateSubscription,
    HookEvent,
    Subscription,
    UpdateSubscription,
    check_single,
    check_unchanged,
    events_text,
    parse_active,
    parse_after,
    parse_id,
    parse_limit,
    query_text,
    shown,
    to_subscription,
)
from service.config import Settings
from service.store import Store

Pool = AsyncConnectionPool[Any]


# Every operation under /api/v1 documents every error it can answer with, so that the
# document and the answers agree (the fuzz tests check it).
API_ERRORS = (400, 401, 404, 405, 413, 429, 503)


# --- subscriptions ------------------------------------------------------------------


def app_parts(request: Request[Any, Any, Any]) -> tuple[State, Store, Settings]:
    """The app's state, store and settings, for the two hot reads (a subscription, a page
    of them): taken from the app's state here rather than as dependencies, whose
    resolution cost about 9% of a GET's instructions."""
    state = request.app.state
    return state, state.store, state.settings


def _subscription_id(text: str) -> int:
    number = parse_id(text)
    if number is None:
        raise ApiError(404, f"no webhook with id {shown(text)}")
    return number


@get("/webhooks", summary="List subscriptions",
     responses=error_responses(*API_ERRORS))
async def list_webhooks(
    request: Request[Any, Any, Any],
    resource: Annotated[str | None, Parameter(description="only this resource")] = None,
    active: Annotated[str | None, Parameter(description="true or false")] = None,
    limit: Annotated[str | None, Parameter(description="1 to 1000, default 100")] = None,
    after: Annotated[str | None, Parameter(
        description="only ids greater than this (the Link header's next page)")] = None,
) -> Response[list[Subscription]]:
    """The caller's subscriptions, oldest first; a `Link: <...>; rel="next"` when more remain.
    The token is checked in the page's own statement (one round trip)."""
    state, store, settings = app_parts(request)
    try:
        check_single(request.query_params.dict(), ("resource", "active", "limit", "after"))
        wanted, kind, is_active, start = (parse_limit(limit), query_text("resource", resource),
                                          parse_active(active), parse_after(after))
    except ApiError:
        await provide_principal(request, store, state)  # 401 and 429 come first
        raise

    row = await admitted_read(request, state, lambda digest: store.list_subscriptions(
        token_hash=digest, resource=kind, active=is_active, after=start, limit=wanted,
        max_bytes=settings.max_page_bytes))
    # Postgres joined the page (each subscription's stored doc), stopping after the
    # row that passes the byte budget: a page always holds one row, and the next one
    # starts after it, so paging still sees every row once.
    body, last_id, more = row[4], row[5], row[6]
    headers = {}
    if more:
        query = {k: v for k, v in (("resource", resource), ("active", active)) if v is not None}
        query.update(limit=str(wanted), after=str(last_id))
        url = request.url.with_replacements(query=urlencode(query), fragment="")
        headers["Link"] = f'<{url}>; rel="next"'
    # The annotation keeps list[Subscription] for the OpenAPI document; the bytes are that.
    return Response(cast(Any, body.encode()), headers=headers, media_type=MediaType.JSON)


@post("/webhooks", summary="Create a subscription (after the verification handshake)",
      status_code=201, dto=Body[CreateSubscription], return_dto=None, guards=[authenticated],
      response_description="the stored subscription",
      responses=error_responses(*API_ERRORS))
async def create_webhook(
    data: JSONBody[CreateSubscription],
    principal: PrincipalDep,
    store: StoreDep,
    client: ClientDep,
    settings: SettingsDep,
    box: BoxDep,
    metrics: MetricsDep,
) -> Response[Subscription]:
    """Validates resource, events and target, verifies the target, stores the subscription."""
    resource, target = data.resource, data.target
    names = await canonical_events(store, resource, events_text(data.events),
                                   settings.max_events_per_subscription)
    filter_, path = await checked_filter(store, resource, names, data.filter)
    await allowed_target(target, settings)
    # Checked before the handshake too, so that a full owner does not bother its target.
    limit = settings.max_subscriptions_per_owner
    if await store.count_subscriptions(owner=principal.owner) >= limit:
        raise too_many(limit)
    async with store.session() as s:
        await check_filter_budget(s, principal, 0, path, settings)
    secret = await verified_secret(client, target, settings, metrics,
                                   "target verification failed")
    async with store.transaction() as s:
        await s.lock_owner(owner=principal.owner)
        await check_filter_budget(s, principal, 0, path, settings)
        row = await s.insert_subscription(
            owner=principal.owner, tenant=principal.tenant, resource=resource, events=names,
            target=target, secret=box.seal(secret), max=limit, filter=filter_,
            filter_path=path, ordering=data.ordering, rate_limit=data.rate_limit)
    if row is None:
        raise too_many(limit)
    await settle(store, row["id"], settings)
    return Response(row["doc"].encode(), status_code=201, media_type=MediaType.JSON,
                    headers={"Location": f"/api/v1/webhooks/{row['id']}"})


@get("/webhooks/{webhook_id:str}", summary="Get a subscription",
     responses=error_responses(*API_ERRORS))
async def get_webhook(webhook_id: IdPath, request: Request[Any, Any, Any]
                      ) -> Response[Subscription]:
    """One of the caller's subscriptions; the token is checked in the same statement."""
    state, store, _ = app_parts(request)
    try:
        number = _subscription_id(webhook_id)
    except ApiError:
        await provide_principal(request, store, state)  # 401 and 429 come first
        raise

    row = await admitted_read(request, state, lambda digest: store.get_subscription(
        token_hash=digest, id=number))
    doc = row[4]
    if doc is None:
        raise ApiError(404, f"no webhook with id {number}")
    return Response(cast(Any, doc.encode()), media_type=MediaType.JSON)


@put("/webhooks/{webhook_id:str}", summary="Activate, deactivate or move a subscription",
     dto=Body[UpdateSubscription], return_dto=None, guards=[authenticated],
     responses=error_responses(*API_ERRORS))
async def update_webhook(
    webhook_id: IdPath,
    data: JSONBody[UpdateSubscription],
    principal: PrincipalDep,
    store: StoreDep,
    settings: SettingsDep,
    client: ClientDep,
    box: BoxDep,
    metrics: MetricsDep,
) -> Response[Subscription]:
    """Sets `active` and/or moves the subscription to a new `target` (verified by the
    handshake with a newly made secret, which then signs; its id and log stay); a field
    left out keeps its value; other fields may be sent only with their current values."""
    number = _subscription_id(webhook_id)
    if isinstance(data.target, str):
        await move_target(store, number, data.target, principal, settings, client, box,
                          metrics)
    async with store.transaction() as s:
        row = await s.lock_subscription(id=number, owner=principal.owner,
                                        tenant=principal.tenant)
        if row is None:
            raise ApiError(404, f"no webhook with id {number}")
        current = to_subscription(row)
        active = current.active if isinstance(data.active, UnsetType) else data.active
        rate_limit = (current.rate_limit if isinstance(data.rate_limit, UnsetType)
                      else data.rate_limit)
        names = None
        if not isinstance(data.events, UnsetType):
            # Compared as the create would have stored them: bare verbs, aliases, order.
            try:
                noun = await s.own_noun(resource=current.resource)
                names = events.parse(events_text(data.events), noun["noun"] if noun else None)
            except events.EventsError as exc:
                raise ApiError(400, str(exc)) from None
        check_unchanged(data, current, names)
        if active and not current.active:
            # Events detached or made private since it was made stay off (its
            # inactive_reason says which): the same check as a create's.
            rows = await s.resource_events(resource=current.resource)
            registry = {r[0]: r[1] for r in rows}
            try:
                events.check(current.events.split(","), registry, current.resource)
            except events.EventsError as exc:
                raise ApiError(400, f"cannot activate webhook {number}: {exc}") from None
        if active and not current.active and current.filter is not None:
            # The owner's filters are counted under the lock creates take too.
            await s.lock_owner(owner=principal.owner)
            stored = await s.subscription_filter_path(id=number, owner=principal.owner,
                                                      tenant=principal.tenant)
            await check_filter_budget(s, principal, number, stored, settings)
        updated = await s.set_subscription_active(id=number, owner=principal.owner,
                                                  tenant=principal.tenant, active=active,
                                                  rate_limit=rate_limit)
    assert updated is not None
    if active and not current.active:
        await settle(store, number, settings)
    return Response(updated["doc"].encode(), media_type=MediaType.JSON)


@delete("/webhooks/{webhook_id:str}", summary="Delete a subscription and its pending deliveries",
        status_code=204, responses=error_responses(*API_ERRORS))
async def delete_webhook(webhook_id: IdPath, principal: PrincipalDep, store: StoreDep) -> None:
    """Deletes the subscription; its queued deliveries go with it."""
    number = _subscription_id(webhook_id)
    if not await store.delete_subscription(id=number, owner=principal.owner,
                                           tenant=principal.tenant):
        raise ApiError(404, f"no webhook with id {number}")


@get("/hook_events", summary="List the events that can be subscribed to",
     responses=error_responses(*API_ERRORS))
async def list_hook_events(principal: PrincipalDep, store: StoreDep
                           ) -> Response[list[HookEvent]]:
    """Every public event, as {"resource", "event", "schema"}, by resource and name:
    `schema` is the JSON Schema of its delivery body, from the table as it is now."""
    tables = await store.event_catalog()
    return Response(cast(Any, schemas.hook_events_json(tables)), media_type=MediaType.JSON)


# --- health -------------------------------------------------------------------------

