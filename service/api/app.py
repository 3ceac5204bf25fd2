"""The REST API: subscriptions under /api/v1, health checks, the OpenAPI document.

`create_app(settings)` builds the Litestar app; its lifespan opens the connection pool
(unless one is passed in) and the outbound HTTP client, and keeps them on `app.state`,
from where dependency injection hands them to the handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, cast
from urllib.parse import urlencode

import httpx
from litestar import Litestar, MediaType, Request, Response, Router, delete, get, post, put
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import RedocRenderPlugin, SwaggerRenderPlugin
from litestar.params import Parameter
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from service import __version__, events
from service.api import deliveries, lifecycle
from service.api.auth import provide_principal
from service.api.errors import (
    ERROR_RESPONSES_DOC,
    EXCEPTION_HANDLERS,
    ApiError,
    ErrorBody,
)
from service.api.handshake import HandshakeFailed, new_secret, verify
from service.api.metrics import ApiMetrics, MetricsController, metrics_config
from service.api.models import (
    CREATE_FIELDS,
    REQUEST_COMPONENTS,
    UPDATE_FIELDS,
    CreateOperation,
    HookEvent,
    Subscription,
    UpdateOperation,
    bool_field,
    check_fields,
    check_single,
    check_unchanged,
    parse_active,
    parse_after,
    parse_id,
    parse_limit,
    parse_object,
    query_text,
    shown,
    string_field,
    to_subscription,
)
from service.api.ratelimit import RateLimiter
from service.config import Settings
from service.crypto import SecretBox
from service.http import make_client
from service.ssrf import TargetRejected, check_target
from service.store import Store, make_pool
from service.tokens import Principal

Pool = AsyncConnectionPool[Any]
# Parameters filled by dependency injection (providers in create_app).
StoreDep = NamedDependency[Store]
PrincipalDep = NamedDependency[Principal]
ClientDep = NamedDependency[httpx.AsyncClient]
log = logging.getLogger("webhooks.api")
SettingsDep = NamedDependency[Settings]
BoxDep = NamedDependency[SecretBox]
MetricsDep = NamedDependency[ApiMetrics]

IdPath = Annotated[str, Parameter(description="subscription id (integer)")]


# Every operation under /api/v1 documents every error it can answer with, so that the
# document and the answers agree (the fuzz tests check it).
API_ERRORS = (400, 401, 404, 405, 413, 429, 503)


def _errors(*codes: int) -> dict[int, ResponseSpec]:
    return {code: ResponseSpec(data_container=ErrorBody, description=ERROR_RESPONSES_DOC[code],
                               generate_examples=False)
            for code in codes}


# --- dependencies -------------------------------------------------------------------

def provide_store(state: State) -> Store:
    """The app's store (named queries over its connection pool)."""
    store: Store = state.store
    return store


def provide_client(state: State) -> httpx.AsyncClient:
    """The app's outbound HTTP client (handshakes)."""
    client: httpx.AsyncClient = state.client
    return client


def provide_settings(state: State) -> Settings:
    """The app's settings."""
    settings: Settings = state.settings
    return settings


def provide_box(state: State) -> SecretBox:
    """What seals secrets before they are stored (encrypted when a key is configured)."""
    box: SecretBox = state.box
    return box


def provide_metrics(state: State) -> ApiMetrics:
    """The app's metrics registry."""
    metrics: ApiMetrics = state.metrics
    return metrics


# --- subscriptions ------------------------------------------------------------------

async def _registry(store: Store, resource: str
                    ) -> tuple[dict[str, bool], str | None, list[str]]:
    """The resource's events (name -> public), its own noun, and the subscribable resources."""
    async with store.session() as s:
        rows = await s.all("api_resource_events", {"resource": resource}, row=tuple_row)
        if any(public for _, public, _ in rows):
            return {r[0]: r[1] for r in rows}, rows[0][2], []
        names = await s.all("api_public_resources", row=tuple_row)
    return {}, None, [r[0] for r in names]


async def _canonical_events(store: Store, resource: str, text: str, max_events: int
                            ) -> list[str]:
    """The checked canonical events of a subscription to `resource`; 400 if any is wrong."""
    registry, own_noun, resources = await _registry(store, resource)
    if not registry:
        raise ApiError(400, f"unknown resource {shown(resource)}; resources that can be "
                            f"subscribed to: {', '.join(resources) or 'none'} "
                            "(see /api/v1/hook_events)")
    try:
        return events.canonicalise(text, own_noun, registry, resource, max_events)
    except events.EventsError as exc:
        raise ApiError(400, str(exc)) from None


def _scope(principal: Principal) -> dict[str, Any]:
    """The query parameters that limit a query to what the caller may see."""
    return {"owner": principal.owner, "tenant": principal.tenant}


async def _settle(store: Store, subscription_id: int, settings: Settings) -> None:
    """Makes a subscription that just became active exact: see webhooks.settle_subscription."""
    (settled,) = await store.one("api_subscription_settle", {
        "id": subscription_id, "timeout": settings.verify_timeout}, row=tuple_row)
    if not settled:
        log.warning("subscription %s: a transaction writing to its resource was still open "
                    "after %gs; its changes may not reach the new subscription",
                    subscription_id, settings.verify_timeout)


def _too_many(limit: int) -> ApiError:
    return ApiError(400, f"this owner already has {limit} subscriptions, the most allowed "
                         "(WEBHOOKS_MAX_SUBSCRIPTIONS_PER_OWNER); delete one first")


def _subscription_id(text: str) -> int:
    number = parse_id(text)
    if number is None:
        raise ApiError(404, f"no webhook with id {shown(text)}")
    return number


@get("/webhooks", summary="List subscriptions",
     responses=_errors(*API_ERRORS))
async def list_webhooks(
    request: Request[Any, Any, Any],
    principal: PrincipalDep,
    store: StoreDep,
    resource: Annotated[str | None, Parameter(description="only this resource")] = None,
    active: Annotated[str | None, Parameter(description="true or false")] = None,
    limit: Annotated[str | None, Parameter(description="1 to 1000, default 100")] = None,
    after: Annotated[str | None, Parameter(
        description="only ids greater than this (the Link header's next page)")] = None,
) -> Response[list[Subscription]]:
    """The caller's subscriptions, oldest first; a `Link: <...>; rel="next"` when more remain."""
    check_single(request.query_params.dict(), ("resource", "active", "limit", "after"))
    wanted = parse_limit(limit)
    params = {**_scope(principal), "resource": query_text("resource", resource),
              "active": parse_active(active), "after": parse_after(after),
              "limit": wanted + 1}
    rows = await store.all("api_subscription_list", params, row=tuple_row)
    page = rows[:wanted]
    headers = {}
    if len(rows) > wanted:
        query = {k: v for k, v in (("resource", resource), ("active", active)) if v is not None}
        query.update(limit=str(wanted), after=str(page[-1][0]))
        url = request.url.with_replacements(query=urlencode(query), fragment="")
        headers["Link"] = f'<{url}>; rel="next"'
    # Postgres built each subscription's JSON (webhooks.subscription_json): join, send.
    body = "[" + ",".join(doc for _, doc in page) + "]"
    # The annotation keeps list[Subscription] for the OpenAPI document; the bytes are that.
    return Response(cast(Any, body.encode()), headers=headers, media_type=MediaType.JSON)


@post("/webhooks", summary="Create a subscription (after the verification handshake)",
      status_code=201, operation_class=CreateOperation,
      response_description="the stored subscription",
      responses=_errors(*API_ERRORS))
async def create_webhook(
    request: Request[Any, Any, Any],
    principal: PrincipalDep,
    store: StoreDep,
    client: ClientDep,
    settings: SettingsDep,
    box: BoxDep,
    metrics: MetricsDep,
) -> Response[Subscription]:
    """Validates resource, events and target, verifies the target, stores the subscription."""
    body = parse_object(await request.body())
    check_fields(body, CREATE_FIELDS, CREATE_FIELDS)
    resource, text, target = (string_field(body, name) for name in CREATE_FIELDS)
    names = await _canonical_events(store, resource, text, settings.max_events_per_subscription)
    try:
        # The whole check, not only each lookup, is bounded by the verify timeout.
        async with asyncio.timeout(settings.verify_timeout):
            await check_target(target, settings.allow_private_targets,
                               settings.max_target_length,
                               timeout=min(settings.dns_timeout, settings.verify_timeout),
                               nameservers=settings.dns_servers or None)
    except TargetRejected as exc:
        raise ApiError(400, str(exc)) from None
    except TimeoutError:
        raise ApiError(400, f"target host did not resolve within {settings.verify_timeout:g} "
                            "seconds") from None
    # Checked before the handshake too, so that a full owner does not bother its target.
    limit = settings.max_subscriptions_per_owner
    (count,) = await store.one("api_subscription_count", _scope(principal), row=tuple_row)
    if count >= limit:
        raise _too_many(limit)
    # No connection is held here: the handshake may take the whole verify timeout.
    secret = new_secret()
    try:
        await verify(client, target, secret, settings.verify_timeout)
    except HandshakeFailed as exc:
        metrics.handshake(exc.outcome)
        raise ApiError(400, f"target verification failed: {exc}") from None
    metrics.handshake("verified")
    async with store.transaction() as s:
        await s.run("api_owner_lock", _scope(principal))
        row = await s.one("api_subscription_insert", {
            **_scope(principal), "resource": resource, "events": names, "target": target,
            "secret": box.seal(secret), "max": limit})
    if row is None:
        raise _too_many(limit)
    await _settle(store, row["id"], settings)
    return Response(row["doc"].encode(), status_code=201, media_type=MediaType.JSON,
                    headers={"Location": f"/api/v1/webhooks/{row['id']}"})


@get("/webhooks/{webhook_id:str}", summary="Get a subscription",
     responses=_errors(*API_ERRORS))
async def get_webhook(webhook_id: IdPath, principal: PrincipalDep, store: StoreDep
                      ) -> Response[Subscription]:
    """One of the caller's subscriptions."""
    number = _subscription_id(webhook_id)
    rows = await store.all("api_subscription_get", {"id": number, **_scope(principal)},
                           row=tuple_row)
    if not rows:
        raise ApiError(404, f"no webhook with id {number}")
    return Response(rows[0][0].encode(), media_type=MediaType.JSON)


@put("/webhooks/{webhook_id:str}", summary="Activate or deactivate a subscription",
     operation_class=UpdateOperation, responses=_errors(*API_ERRORS))
async def update_webhook(
    webhook_id: IdPath,
    request: Request[Any, Any, Any],
    principal: PrincipalDep,
    store: StoreDep,
    settings: SettingsDep,
) -> Response[Subscription]:
    """Sets `active`; other fields may be sent only with their current values."""
    number = _subscription_id(webhook_id)
    body = parse_object(await request.body())
    check_fields(body, UPDATE_FIELDS, ("active",))
    active = bool_field(body, "active")
    text = string_field(body, "events") if "events" in body else None
    key = {"id": number, **_scope(principal)}
    async with store.transaction() as s:
        row = await s.one("api_subscription_lock", key)
        if row is None:
            raise ApiError(404, f"no webhook with id {number}")
        current = to_subscription(row)
        names = None
        if text is not None:
            # Compared as the create would have stored them: bare verbs, aliases, order.
            try:
                noun = await s.one("api_own_noun", {"resource": current.resource})
                names = events.parse(text, noun["noun"] if noun else None)
            except events.EventsError as exc:
                raise ApiError(400, str(exc)) from None
        check_unchanged(body, current, names)
        updated = await s.one("api_subscription_set_active", {**key, "active": active})
    assert updated is not None
    if active and not current.active:
        await _settle(store, number, settings)
    return Response(updated["doc"].encode(), media_type=MediaType.JSON)


@delete("/webhooks/{webhook_id:str}", summary="Delete a subscription and its pending deliveries",
        status_code=204, responses=_errors(*API_ERRORS))
async def delete_webhook(webhook_id: IdPath, principal: PrincipalDep, store: StoreDep) -> None:
    """Deletes the subscription; its queued deliveries go with it."""
    number = _subscription_id(webhook_id)
    rows = await store.all("api_subscription_delete", {"id": number, **_scope(principal)})
    if not rows:
        raise ApiError(404, f"no webhook with id {number}")


@get("/hook_events", summary="List the events that can be subscribed to",
     responses=_errors(*API_ERRORS))
async def list_hook_events(principal: PrincipalDep, store: StoreDep) -> list[HookEvent]:
    """Every public event, as {"resource", "event"}, by resource and name."""
    rows = await store.all("api_hook_events")
    return [HookEvent(resource=r["resource"], event=r["event"]) for r in rows]


# --- health -------------------------------------------------------------------------

@get("/healthz", summary="Process up", include_in_schema=True)
async def healthz() -> dict[str, str]:
    """200 while the process serves requests."""
    return {"status": "ok"}


@get("/readyz", summary="Database reachable", responses=_errors(503))
async def readyz(store: StoreDep) -> Response[dict[str, str]]:
    """200 when `select 1` runs through the pool, else 503."""
    try:
        async with asyncio.timeout(5.0):
            await store.run("api_ping")
    except Exception as exc:
        # Readiness answers, whatever the failure; the type says enough to an operator.
        return Response({"error": f"database unreachable ({type(exc).__name__})"},
                        status_code=503)
    return Response({"status": "ok"})


# --- the app ------------------------------------------------------------------------

def create_app(settings: Settings, pool: Pool | None = None) -> Litestar:
    """The API app; opens (and closes) its own pool unless `pool` is given."""
    metrics = ApiMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if pool is None:
                own = make_pool(settings.database_url, max_size=settings.pool_size, name="api")
                await own.open(wait=True)
                stack.push_async_callback(own.close)
                app.state.pool = own
            else:
                app.state.pool = pool
            app.state.store = Store(app.state.pool)
            client = make_client(allow_private=settings.allow_private_targets,
                                 timeout=settings.verify_timeout,
                                 dns_timeout=min(settings.dns_timeout, settings.verify_timeout),
                                 dns_servers=settings.dns_servers)
            stack.push_async_callback(client.aclose)
            app.state.client = client
            yield

    api = Router(
        path="/api/v1",
        route_handlers=[list_webhooks, create_webhook, get_webhook, update_webhook,
                        delete_webhook, list_hook_events, *deliveries.HANDLERS,
                        *lifecycle.HANDLERS],
        dependencies={"principal": Provide(provide_principal)},
        security=[{"BearerToken": []}],
        tags=["webhooks"],
    )
    return Litestar(
        route_handlers=[api, healthz, readyz, MetricsController],
        dependencies={
            "store": Provide(provide_store, sync_to_thread=False),
            "client": Provide(provide_client, sync_to_thread=False),
            "settings": Provide(provide_settings, sync_to_thread=False),
            "box": Provide(provide_box, sync_to_thread=False),
            "metrics": Provide(provide_metrics, sync_to_thread=False),
        },
        state=State({"settings": settings, "box": SecretBox(settings.encryption_key),
                     "metrics": metrics,
                     "limiter": RateLimiter(settings.rate_limit, settings.rate_burst)}),
        middleware=[metrics_config(metrics).middleware],
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_body_bytes,
        logging_config=None,
        openapi_config=OpenAPIConfig(
            title="Webhook subscription service",
            version=__version__,
            description="Subscribe to changes of database rows; every error is "
                        '{"error": "<message>"}.',
            path="/schema",
            components=[REQUEST_COMPONENTS],
            render_plugins=[SwaggerRenderPlugin(path=["/", "/swagger"]), RedocRenderPlugin()],
        ),
    )

