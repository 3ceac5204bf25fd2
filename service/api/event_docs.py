"""The OpenAPI document's top-level `webhooks` object: what a receiver gets.

GET /schema/openapi.json sent with a valid `Authorization: Bearer <token>` answers the
document with one operation per public event (and `webhook.test`, and the backfill's
`<noun>.snapshot` of each table): the POST its target receives, the body's JSON Schema as
GET /api/v1/hook_events gives it (service.api.schemas) and the signature headers, so a
receiver can be generated from it. Without a token (or with one that is not valid, or
while the database cannot be read) the document is Litestar's own, which names no
table's columns and needs no database.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar.types import ASGIApp, Receive, Scope, Send

from service import tokens
from service.api import schemas
from service.api.ratelimit import RateLimiter, retry_after
from service.store import Store, StoreError, budget

log = logging.getLogger("webhooks.api")

OPENAPI_PATH = "/schema/openapi.json"
# Seconds the document waits for the database (the token, the catalog) before it is
# answered without its webhooks.
DOCUMENT_DB_BUDGET = 2.0
Schema = dict[str, Any]

RESPONSES = {
    "2XX": {"description": "delivered (any 2xx within WEBHOOKS_DELIVERY_TIMEOUT)"},
    "410": {"description": "gone: the subscription becomes inactive and nothing more is sent"},
    "default": {"description": "any other answer, a timeout or a redirect fails the attempt; "
                               "it is retried on WEBHOOKS_RETRY_SCHEDULE"},
}


def operation(resource: str, event: str, schema: msgspec.Raw) -> Schema:
    """The path item of one event: the POST its subscribers' targets receive."""
    return {"post": {
        "operationId": "receive_" + event.replace(".", "_"),
        "summary": f"{event} (resource {resource})",
        "description": f"The body of a {event} delivery, exactly as sent to the target of "
                       f"every active subscription to it, signed with the subscription's "
                       f"secret; de-duplicate on webhook-id.",
        "tags": [resource],
        "parameters": [
            {"name": name, "in": "header", "required": True, "description": description,
             "schema": {"type": "string"}}
            for name, description in schemas.SIGNATURE_HEADERS.items()],
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": schema}}},
        "responses": RESPONSES,
        "security": [],
    }}


# The event every subscription may be sent (POST /api/v1/webhooks/:id/test), listed nowhere.
TEST_EVENT = {"hook_resource": "webhooks", "events": ["webhook.test"], "resource": None}


def webhooks_object(tables: list[dict[str, Any]]) -> Schema:
    """The `webhooks` object of the events of api_event_catalog's rows, of webhook.test
    and of each table's backfill snapshots."""
    return {event: operation(resource, event, schema) for resource, event, schema
            in schemas.event_schemas([*tables, TEST_EVENT], snapshots=True)}


def _token(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


async def _document(app: Any, token: str) -> tuple[int, Schema, dict[str, str]] | None:
    """(status, body, headers) for a request that carries a token; None to answer as
    without one."""
    store: Store | None = getattr(app.state, "store", None)
    if store is None:
        return None
    try:
        with budget(DOCUMENT_DB_BUDGET):
            return await _with_webhooks(app, store, token)
    except StoreError as exc:  # the database is down or slow: the document without them
        log.warning("the OpenAPI document goes without its webhooks: %s", exc)
        return None


async def _with_webhooks(app: Any, store: Store, token: str
                         ) -> tuple[int, Schema, dict[str, str]] | None:
    principal = await tokens.authenticate(store, token)
    if principal is None:
        return None
    limiter: RateLimiter = app.state.limiter
    wait = limiter.acquire(principal.token_id)
    if wait > 0:
        return 429, {"error": f"too many requests with this token; retry after "
                              f"{retry_after(wait)} s"}, {"Retry-After": retry_after(wait)}
    rows = await store.event_catalog()
    document: Schema = app.openapi_schema.to_schema()
    document["webhooks"] = webhooks_object(rows)
    return 200, document, {}


def with_webhooks(app: ASGIApp) -> ASGIApp:
    """ASGI middleware: GET /schema/openapi.json with a valid token gets `webhooks`."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        token = None
        if (scope["type"] == "http" and scope.get("method") == "GET"
                and scope["path"].rstrip("/") == OPENAPI_PATH):
            token = _token(scope)
        answer = await _document(scope["app"], token) if token else None
        if answer is None:
            await app(scope, receive, send)
            return
        status, body, headers = answer
        content = msgspec.json.encode(body)
        media = "application/vnd.oai.openapi+json" if status == 200 else "application/json"
        start: Any = {"type": "http.response.start", "status": status, "headers": [
            (b"content-type", media.encode()), (b"content-length", str(len(content)).encode()),
            (b"cache-control", b"private, no-store"),
            *((k.lower().encode(), v.encode()) for k, v in headers.items())]}
        end: Any = {"type": "http.response.body", "body": content}
        await send(start)
        await send(end)

    return middleware
