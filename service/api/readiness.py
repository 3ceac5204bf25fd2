"""GET /readyz, and the API's answer while the database is not migrated.

/readyz is 200 when the database answers and every migration of this version is applied,
else 503 with the reason in `{"error"}`, and it answers within READY_WITHIN seconds
whatever the database does (Kubernetes' default probe timeout is 1 s): the check runs in a
task of its own, shared by the probes that arrive while it runs, which the probe stops
waiting for rather than cancels (a cancelled query waits for the server's answer to the
cancel, which a hung server never gives).

Until a check has found the database migrated, every request under /api/v1 runs one first
and answers 503 `run webhooks migrate` (service.availability.not_migrated) rather than
failing in its first query; once migrated, the check costs nothing more, and a query that
finds the service's tables gone (errors.py) makes the requests check again.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import State
from psycopg_pool import AsyncConnectionPool

from service.api.errors import ApiError, error_responses
from service.availability import MIGRATE_HINT, not_migrated
from service.store import translated
from service.store.deadline import checked_out, watched

# Seconds a probe waits for the check: with the HTTP exchange and a busy process's
# stalls, under Kubernetes' 1 s.
READY_WITHIN = 0.6
UNAVAILABLE = "the database is unavailable; try again later"
# Seconds a request waits for the check (the API's wait for a pooled connection).
REQUEST_WAIT = 5.0


class Readiness:
    """Whether the database answers and is migrated, one check at a time."""

    def __init__(self, pool: AsyncConnectionPool, timeout: float = 10.0) -> None:
        self._pool = pool
        # The check's own deadlines, a checkout's and its statements' (as the store's): a
        # connection that stops answering is abandoned, and the next check takes another.
        self._timeout = timeout
        self._check: asyncio.Task[str | None] | None = None
        # Set once a check found the database migrated; cleared when a query finds the
        # service's tables missing (errors.py).
        self.migrated = False

    async def _run(self) -> str | None:
        with translated():
            async with checked_out(self._pool, self._timeout) as conn:
                with watched(conn, self._timeout, charge=False):
                    reason = await not_migrated(conn)
        self.migrated = reason is None
        return reason

    async def problem(self, within: float = READY_WITHIN) -> str | None:
        """None when ready, else what is wrong; answers within `within` seconds."""
        if self._check is None or self._check.done():
            # In a context of its own: no request's database budget (service.store.budget)
            # applies to a check that several requests share.
            self._check = asyncio.create_task(self._run(), name="readiness",
                                              context=contextvars.Context())
            # Its outcome is read below, or by nobody if every probe gave up waiting.
            self._check.add_done_callback(lambda t: t.cancelled() or t.exception())
        check = self._check
        done, _ = await asyncio.wait({check}, timeout=within)
        if not done:
            return f"the database did not answer within {within:g} s"
        if check.cancelled():
            return UNAVAILABLE
        exc = check.exception()
        if exc is not None:
            # The type says enough to an operator; a message could quote the database's.
            return f"database unreachable ({type(exc).__name__})"
        return check.result()


def readiness(state: State) -> Readiness:
    """The app's Readiness (made by its lifespan)."""
    ready: Readiness = state.readiness
    return ready


@get("/readyz", summary="Database reachable and migrated",
     responses=error_responses(503, docs={503: "database unreachable, or not migrated for "
                                               "this version (run `webhooks migrate`)"}))
async def readyz(state: State) -> Response[dict[str, str]]:
    """200 when the database answers and every migration of this version is applied, else
    503 saying why; within a second whatever the database does."""
    problem = await readiness(state).problem()
    if problem is not None:
        return Response({"error": problem}, status_code=503)
    return Response({"status": "ok"})


async def require_migrated(request: Request[Any, Any, Any]) -> None:
    """before_request of /api/v1: 503 saying to run `webhooks migrate` (or that the
    database is unavailable) until a check finds the database migrated. A request waits
    for the check as long as it would for a pooled connection."""
    ready = readiness(request.app.state)
    if ready.migrated:
        return
    problem = await ready.problem(within=REQUEST_WAIT)
    if problem is not None:
        raise ApiError(503, problem if MIGRATE_HINT in problem else UNAVAILABLE)
