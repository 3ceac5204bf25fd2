"""The REST API app: its routes under /api/v1 (service.api.webhooks, deliveries,
rotation, backfills), health checks, metrics, the OpenAPI document and the dashboard page
(service.api.dashboard).

`create_app(settings)` builds the Litestar app; its lifespan opens the connection pool
(unless one is passed in) and the outbound HTTP client, and keeps them on `app.state`,
from where dependency injection hands them to the handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from litestar import Litestar, Response, Router, get
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.types import ASGIApp, Receive, Scope, Send
from prometheus_client import CollectorRegistry

from service import __version__
from service.api import backfills, dashboard, deliveries, event_docs, rotation, tracing
from service.api.apidocs import routes as apidocs
from service.api.apidocs.routes import LocalSwaggerPlugin
from service.api.auth import provide_principal
from service.api.errors import (
    EXCEPTION_HANDLERS,
    NOT_MIGRATED,
    error_responses,
)
from service.api.handshake import BODY_LIMIT, Outbound
from service.api.head import head_as_get
from service.api.metrics import ApiMetrics, MetricsController, request_metrics
from service.api.models import (
    REQUEST_COMPONENTS,
)
from service.api.ratelimit import RateLimiter
from service.api.readiness import Readiness, readyz, require_migrated
from service.api.webhooks import (
    Pool,
    create_webhook,
    delete_webhook,
    get_webhook,
    list_hook_events,
    list_webhooks,
    update_webhook,
)
from service.config import Settings
from service.crypto import SecretBox
from service.curl import CurlClient
from service.http import make_client
from service.logs import protect_url
from service.store import Store, StoreError, budget, make_pool

log = logging.getLogger("webhooks.api")


def provide_store(state: State) -> Store:
    """The app's store (named queries over its connection pool)."""
    store: Store = state.store
    return store


def provide_client(state: State) -> Outbound:
    """The app's outbound HTTP client (handshakes)."""
    outbound: Outbound = state.outbound
    return outbound


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


# How long a request waits for a pooled connection before it answers 503: long enough for
# a burst to queue behind a busy pool, short enough that a database that is down gives a
# quick answer rather than a hung client.
API_POOL_TIMEOUT = 5.0


@get("/healthz", summary="Process up", include_in_schema=True)
async def healthz() -> dict[str, str]:
    """200 while the process serves requests."""
    return {"status": "ok"}


@get("/livez", summary="Worker making progress", responses=error_responses(503))
async def livez(state: State) -> Response[dict[str, Any]]:
    """`webhooks run`'s worker: 503 when it made no progress for WEBHOOKS_LIVENESS_TIMEOUT
    while the database answers and work is due (restart it), else 200."""
    status, body = await asyncio.to_thread(state.liveness)
    return Response(body, status_code=status)


def db_budget(seconds: float) -> Callable[[ASGIApp], ASGIApp]:
    """A middleware that bounds what a request waits for the database, checkouts and
    statements together (service.store.budget): past it, the request answers 503."""
    def middleware(app: ASGIApp) -> ASGIApp:
        async def bounded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            with budget(seconds):
                await app(scope, receive, send)
        return bounded
    return middleware


async def _make_partitions(store: Store) -> None:
    try:
        await deliveries.ensure_partitions(store)
    except StoreError as exc:
        if exc.sqlstate in NOT_MIGRATED:  # /readyz and every request say so too
            log.warning("the database is not migrated: run `webhooks migrate`")
            return
        log.warning("could not make today's partitions at start-up: %s", exc)


# --- the app ------------------------------------------------------------------------

def create_app(settings: Settings, pool: Pool | None = None,
               other_metrics: Sequence[CollectorRegistry] = (),
               liveness: Callable[[], tuple[int, dict[str, Any]]] | None = None) -> Litestar:
    """The API app; opens (and closes) its own pool unless `pool` is given. GET /metrics
    shows its own metrics and those of `other_metrics` (a worker in the same process), and
    GET /livez the `liveness` check of that worker, when one is given."""
    metrics = ApiMetrics(other_metrics)
    protect_url(settings.database_url)  # no part of its password in a log line or an error

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if pool is None:
                # The pool connects in the background: the API binds at once whatever the
                # database does, /readyz and every request that needs the database answer
                # 503 while it is down, and the pool reconnects when it is back.
                own = make_pool(settings.database_url, max_size=settings.pool_size, name="api",
                                timeout=API_POOL_TIMEOUT, tcp_timeout=settings.db_tcp_timeout,
                                connect_timeout=settings.db_connect_timeout)
                await own.open(wait=False)
                stack.push_async_callback(own.close)
                app.state.pool = own
            else:
                app.state.pool = pool
            # Each checkout and statement within WEBHOOKS_API_DB_TIMEOUT, and a request's
            # all together too (db_budget).
            app.state.store = Store(app.state.pool, settings.api_db_timeout)
            # /readyz, and the 503 of every request while the database is not migrated.
            app.state.readiness = Readiness(app.state.pool, settings.api_db_timeout)
            # In the background, so that the API binds at once even while the database is
            # down. Not fatal: the worker makes them too, and test events retry after
            # making them; a role that may not create tables gets its error there.
            maker = asyncio.create_task(_make_partitions(app.state.store))
            stack.callback(maker.cancel)
            client = make_client(allow_private=settings.allow_private_targets,
                                 timeout=settings.verify_timeout,
                                 dns_timeout=min(settings.dns_timeout, settings.verify_timeout),
                                 dns_servers=settings.dns_servers,
                                 ca_bundle=settings.ca_bundle)
            stack.push_async_callback(client.aclose)
            app.state.outbound = Outbound(client)
            if settings.delivery_proxy is not None:
                # Handshakes go through the delivery proxy, as deliveries do.
                proxied = CurlClient(allow_private=settings.allow_private_targets,
                                     dns_timeout=min(settings.dns_timeout,
                                                     settings.verify_timeout),
                                     dns_servers=settings.dns_servers,
                                     connect_timeout=settings.verify_timeout,
                                     body_limit=BODY_LIMIT, ca_bundle=settings.ca_bundle,
                                     proxy=settings.delivery_proxy)
                stack.push_async_callback(proxied.close)
                app.state.outbound = Outbound(proxied)
            yield

    api = Router(
        path="/api/v1",
        route_handlers=[list_webhooks, create_webhook, get_webhook, update_webhook,
                        delete_webhook, list_hook_events, *deliveries.HANDLERS,
                        *rotation.HANDLERS, *backfills.HANDLERS],
        dependencies={"principal": Provide(provide_principal)},
        before_request=require_migrated,
        security=[{"BearerToken": []}],
        tags=["webhooks"],
    )
    app = Litestar(
        route_handlers=[api, healthz, readyz, *([livez] if liveness is not None else []),
                        MetricsController, *dashboard.HANDLERS,
                        apidocs.home],
        dependencies={
            "store": Provide(provide_store, sync_to_thread=False),
            "client": Provide(provide_client, sync_to_thread=False),
            "settings": Provide(provide_settings, sync_to_thread=False),
            "box": Provide(provide_box, sync_to_thread=False),
            "metrics": Provide(provide_metrics, sync_to_thread=False),
        },
        state=State({"settings": settings, "box": SecretBox(settings.encryption_key),
                     "liveness": liveness,
                     "metrics": metrics,
                     "limiter": RateLimiter(settings.rate_limit, settings.rate_burst)}),
        middleware=[request_metrics(metrics), apidocs.page_headers,
                    db_budget(settings.api_db_timeout),
                    # GET /schema/openapi.json with a token: the events' `webhooks`.
                    event_docs.with_webhooks],
        lifespan=[lifespan],
        plugins=tracing.plugins(),
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_body_bytes,
        logging_config=None,
        openapi_config=OpenAPIConfig(
            title="Webhook subscription service",
            version=__version__,
            description="Subscribe to changes of database rows; every error is "
                        '`{"error": "<message>"}`.',
            path="/schema",
            components=[REQUEST_COMPONENTS],
            render_plugins=[LocalSwaggerPlugin()],
        ),
    )
    # HEAD on every GET route answers as GET, without the body (head.py).
    app.asgi_handler = head_as_get(app.asgi_handler)
    return app

