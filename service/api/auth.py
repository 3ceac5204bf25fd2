"""Who is calling: the bearer token of a request, checked against the database, then the
per-token request rate limit. Handlers receive the result as the `principal` dependency."""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency

from service import tokens
from service.api.errors import AUTHENTICATE, ApiError
from service.api.ratelimit import RateLimiter, retry_after
from service.store import Store
from service.tokens import Principal

StoreDep = NamedDependency[Store]

# One message for every token that is not a valid one (malformed, wrong length, unknown,
# revoked), so answers tell an attacker nothing about how close a guess came.
INVALID_TOKEN = "unknown or revoked token"


async def provide_principal(request: Request[Any, Any, Any], store: StoreDep,
                            state: State) -> Principal:
    """The caller named by `Authorization: Bearer <token>`: 401 without a valid token, 429
    when the token is over its request rate."""
    header = request.headers.get("authorization")
    if header is None:
        raise ApiError(401, "missing Authorization header: send Authorization: Bearer <token>",
                       {"WWW-Authenticate": AUTHENTICATE})
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "Authorization header must have the form: Bearer <token>",
                       {"WWW-Authenticate": AUTHENTICATE})
    principal = None
    if tokens.well_formed(token):
        principal = await tokens.authenticate(store, token)
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
