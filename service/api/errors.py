"""The one place where every failure of an API request becomes `{"error": "..."}`.

Handlers raise ApiError with the status and a message a person can act on; Litestar's own
exceptions (routing, body size, parameter validation) and anything unexpected are mapped
here too, so Litestar's default error shape never reaches a client.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ExceptionHandlersMap

from service.api.bodies import EMPTY, BodyRefused, refusal
from service.api.head import HEAD_MARK, allowed
from service.logs import redact
from service.store import StoreRejected, StoreUnavailable

log = logging.getLogger("webhooks.api")

# The default of WEBHOOKS_MAX_BODY_BYTES; the app's own limit is in its settings.
MAX_BODY_SIZE = 65536
AUTHENTICATE = 'Bearer realm="webhooks"'


class ErrorBody(msgspec.Struct):
    """Every error response: one human-readable message."""

    error: str


class ApiError(Exception):
    """A request the API refuses; `status` and `message` go to the client as they are."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def error_response(status: int, message: str, headers: dict[str, str] | None = None
                   ) -> Response[ErrorBody]:
    """The JSON error response every failure ends as; secrets and tokens, even a client's
    own echoed back, are masked."""
    return Response(ErrorBody(error=redact(message)), status_code=status, headers=headers,
                    media_type="application/json")


def _api_error(request: Request[Any, Any, Any], exc: ApiError) -> Response[ErrorBody]:
    return error_response(exc.status, exc.message, exc.headers)


def _validation(request: Request[Any, Any, Any], exc: ValidationException) -> Response[ErrorBody]:
    # A request body that is not its declared type (bodies.Body), or none at all (Litestar
    # hands the route no `data` then): the field and the problem in the API's words.
    if isinstance(exc, BodyRefused):
        return error_response(400, refusal(exc))
    items = exc.extra if isinstance(exc.extra, list) else []
    if any(isinstance(item, dict) and item.get("source") == "body" for item in items):
        return error_response(400, EMPTY)
    # Litestar's messages name the parameter; keep them, drop its {"extra": ...} shape.
    details = []
    if isinstance(exc.extra, list):
        for item in exc.extra:
            if isinstance(item, dict) and item.get("message"):
                key = item.get("key")
                details.append(f"{key}: {item['message']}" if key else str(item["message"]))
    message = "invalid request" + (": " + "; ".join(details) if details else "")
    return error_response(400, message)


def _not_found(request: Request[Any, Any, Any], exc: NotFoundException) -> Response[ErrorBody]:
    return error_response(404, "no such endpoint; the API is described at /schema")


def _not_allowed(request: Request[Any, Any, Any], exc: MethodNotAllowedException
                 ) -> Response[ErrorBody]:
    allow = allowed((exc.headers or {}).get("allow", ""))
    method = "HEAD" if request.scope.get(HEAD_MARK) else request.method
    message = f"method {method} is not allowed here"
    if allow:
        message += f"; allowed: {allow}"
    return error_response(405, message, {"Allow": allow} if allow else None)


def _http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[ErrorBody]:
    status = exc.status_code
    if status == 413:
        settings = getattr(request.app.state, "settings", None)
        limit = getattr(settings, "max_body_bytes", MAX_BODY_SIZE)
        return error_response(413, f"request body is larger than {limit} bytes "
                                   "(WEBHOOKS_MAX_BODY_BYTES)")
    if status >= 500:
        log.error("request failed: %s", type(exc).__name__)
        return error_response(status, "internal error")
    return error_response(status, str(exc.detail) or "bad request")


# Seconds a client is told to wait after a 503 for the database: connections are
# replaced as soon as the database accepts them again.
DATABASE_RETRY_AFTER = 2


def _database(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    log.error("database unavailable: %s", type(exc).__name__)
    return error_response(503, "the database is unavailable; try again later",
                          {"Retry-After": str(DATABASE_RETRY_AFTER)})


# No such table, schema or function: the database is not migrated for this version (a
# query of a request found the service's tables missing).
NOT_MIGRATED = ("42P01", "3F000", "42883")


def _rejected(request: Request[Any, Any, Any], exc: StoreRejected) -> Response[ErrorBody]:
    if exc.sqlstate not in NOT_MIGRATED:
        return _unexpected(request, exc)
    log.error("the database is not migrated for this version (%s)", exc.sqlstate)
    readiness = getattr(request.app.state, "readiness", None)
    if readiness is not None:
        readiness.migrated = False  # the next requests check first (readiness.py)
    return error_response(503, "the database is not migrated for this version: run "
                               "`webhooks migrate`")


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    # The type alone: messages of unexpected errors may quote request data.
    handler = getattr(request.scope.get("route_handler"), "handler_name", "?")
    log.error("unhandled %s in %s %s", type(exc).__name__, request.method, handler)
    return error_response(500, "internal error")


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    ApiError: _api_error,
    ValidationException: _validation,
    NotFoundException: _not_found,
    MethodNotAllowedException: _not_allowed,
    HTTPException: _http,
    StoreUnavailable: _database,
    StoreRejected: _rejected,
    Exception: _unexpected,
}

ERROR_RESPONSES_DOC = {
    400: "invalid input: malformed JSON, wrong types, missing or unknown fields, unknown "
         "resource or event, bad target, failed verification",
    401: "missing, malformed, unknown or revoked token",
    404: "unknown id, or one that belongs to another owner",
    405: "method not allowed on this path",
    413: f"request body larger than WEBHOOKS_MAX_BODY_BYTES (default {MAX_BODY_SIZE} bytes)",
    429: "too many requests with this token (WEBHOOKS_RATE_LIMIT); Retry-After says when "
         "to try again",
    503: "database unavailable, or not migrated for this version (run `webhooks migrate`)",
}


def error_responses(*codes: int, docs: dict[int, str] | None = None
                    ) -> dict[int, ResponseSpec]:
    """The OpenAPI error responses of a route: the {"error"} body with what each code means
    (`docs` overrides ERROR_RESPONSES_DOC for that route)."""
    described = {**ERROR_RESPONSES_DOC, **(docs or {})}
    return {code: ResponseSpec(data_container=ErrorBody, description=described[code],
                               generate_examples=False)
            for code in codes}
