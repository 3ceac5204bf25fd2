"""Who is calling: the bearer token of a request, checked against the database, then the
per-token request rate limit. Handlers receive the result as the `principal` dependency."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers import BaseRouteHandler

from service import tokens
from service.api.deps import StoreDep
from service.api.errors import AUTHENTICATE, ApiError
from service.api.ratelimit import RateLimiter, retry_after
from service.api.readiness import require_migrated
from service.tokens import Principal

# One message for every token that is not a valid one (malformed, wrong length, unknown,
# revoked), so answers tell an attacker nothing about how close a guess came.
INVALID_TOKEN = "unknown or revoked token"
# Where a request keeps its admitted principal (its connection state).
PRINCIPAL = "principal"


async def provide_principal(request: Request[Any, Any, Any], store: StoreDep,
                            state: State) -> Principal:
    """The caller named by `Authorization: Bearer <token>`: 401 without a valid token, 429
    when the token is over its request rate. Once per request: a route's guard may have
    admitted it already (`authenticated`)."""
    admitted: Principal | None = request.state.get(PRINCIPAL)
    if admitted is None:
        admitted = admit(await tokens.authenticate(store, bearer_token(request)), state)
        request.state[PRINCIPAL] = admitted
    return admitted


async def authenticated(connection: ASGIConnection[Any, Any, Any, Any],
                        handler: BaseRouteHandler) -> None:
    """A guard of the routes that take a body (bodies.Body): Litestar decodes a route's
    `data` before it resolves the `principal` dependency, so the caller is admitted here
    first, and a request without a valid token is answered 401 whatever its body. Guards
    run before the before_request hook: a database not migrated is said here first (503),
    as on every other route."""
    request = cast(Request[Any, Any, Any], connection)
    await require_migrated(request)
    state = connection.app.state
    await provide_principal(request, state.store, state)


def bearer_token(request: Request[Any, Any, Any]) -> str:
    """The token of the request's `Authorization: Bearer` header (401 without one). The
    reads that check it in their own statement (the subscription GETs) start here."""
    header = request.headers.get("authorization")
    if header is None:
        raise ApiError(401, "missing Authorization header: send Authorization: Bearer <token>",
                       {"WWW-Authenticate": AUTHENTICATE})
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "Authorization header must have the form: Bearer <token>",
                       {"WWW-Authenticate": AUTHENTICATE})
    return token


def admit(principal: Principal | None, state: State) -> Principal:
    """The principal of a looked-up token: 401 when there is none (malformed, unknown,
    revoked), 429 when the token is over its request rate."""
    if principal is None:
        raise ApiError(401, INVALID_TOKEN,
                       {"WWW-Authenticate": AUTHENTICATE + ', error="invalid_token"'})
    limiter: RateLimiter = state.limiter
    wait = limiter.acquire(principal.token_id)
    if wait > 0:
        raise ApiError(429, f"too many requests with this token: at most {limiter.rate:g} per "
                            f"second, bursts of {limiter.burst} (WEBHOOKS_RATE_LIMIT, "
                            f"WEBHOOKS_RATE_BURST); retry after {retry_after(wait)} s",
                       {"Retry-After": retry_after(wait)})
    return principal


async def admitted_read(request: Request[Any, Any, Any], state: State,
                        read: Callable[[bytes], Awaitable[Sequence[Any] | None]]
                        ) -> Sequence[Any]:
    """A read that checks the request's token in its own statement (one round trip):
    `read(token_hash)` returns one row, the token's id, owner, tenant and hash first, then
    what it read for that token's owner; None when the token is unknown or revoked. The
    row, once the token is admitted (401 and 429 as provide_principal answers them); a
    malformed token reads nothing."""
    token = bearer_token(request)
    row, digest = None, b""
    if tokens.well_formed(token):
        digest = tokens.hash_token(token)
        row = await read(digest)
    admit(tokens.principal_of(row, digest), state)
    assert row is not None  # admitted: the token's row came
    return row
