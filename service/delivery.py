"""Deliveries: claim due ones with a lease, send one signed POST each, record the outcomes."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache

import aiohttp
import psycopg
from psycopg.rows import class_row
from psycopg_pool import AsyncConnectionPool
from yarl import URL

from service.config import Settings
from service.db import query
from service.http import check_literal
from service.logs import redact
from service.retry import next_delay
from service.signing import message_id, signed_headers
from service.ssrf import TargetRejected

log = logging.getLogger("webhooks.delivery")

# How much of a response body is read, and kept as last_failure_content.
BODY_LIMIT = 1024


@dataclass(frozen=True)
class Claim:
    """A delivery this worker holds the lease of, with what sending it needs."""

    id: int
    attempts: int
    subscription_id: int
    active: bool
    target: str
    secret: str = field(repr=False)  # as stored: maybe encrypted, never logged
    event: str
    body: str
    due: datetime


@dataclass(frozen=True)
class Outcome:
    """One finished attempt, ready to be recorded."""

    claim: Claim
    status: int  # HTTP status, 0 when no response came
    outcome: str  # the delivery's new status: succeeded, failed or pending (retry)
    retry_in: float  # seconds until the retry, when outcome is pending
    attempted_at: datetime
    duration_ms: float
    error: str | None  # the error, or the start of the response body, for failures


def saturated(busy: Mapping[int, int], per_target: int, degraded: Collection[int]
              ) -> list[int]:
    """The subscriptions at their cap: `per_target` in flight, or 1 when degraded."""
    return [sid for sid, n in busy.items() if n >= (1 if sid in degraded else per_target)]


async def claim(pool: AsyncConnectionPool, *, limit: int, per_target: int,
                busy: Mapping[int, int], lease: float, scan: int,
                degraded: Collection[int] = ()) -> list[Claim]:
    """Claims up to `limit` due deliveries, committed before returning, in start order.

    `busy` maps subscription ids to deliveries this worker has in flight for them; none
    gets more than `per_target` in flight, and the `degraded` ones (whose last attempt
    failed) no more than one. Deliveries of inactive subscriptions are closed as failed and
    not returned.
    """
    params = {
        "limit": limit,
        "scan": max(scan, limit),
        "per_target": per_target,
        "lease": lease,
        "busy_ids": list(busy),
        "busy_counts": list(busy.values()),
        "saturated": saturated(busy, per_target, degraded),
        "degraded": list(degraded),
    }
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=class_row(Claim))
        await cur.execute(query("claim"), params)
        rows = await cur.fetchall()
    # RETURNING has no order: attempts of one subscription start in event order.
    return sorted((c for c in rows if c.active), key=lambda c: (c.due, c.id))


@lru_cache(maxsize=4096)
def target_url(target: str, allow_private: bool) -> URL:
    """The parsed target, if its host is not a forbidden IP literal (names are checked by the
    resolver at connection time). Cached: a worker sends to few targets, many times."""
    url = URL(target)
    check_literal(url.host, allow_private)
    return url


async def send(session: aiohttp.ClientSession, c: Claim, secret: str, settings: Settings
               ) -> Outcome:
    """Makes one POST attempt of the claimed delivery, signed with `secret` (the plain one).

    Returns the attempt's outcome: what the delivery becomes and when it is retried.
    """
    body = c.body.encode()
    now = time.time()
    headers = signed_headers(secret, message_id(c.id), int(now), body)
    attempted_at = datetime.fromtimestamp(now, UTC)
    started = time.perf_counter()
    status = 0
    error: str | None = None
    retry_after: str | None = None
    try:
        url = target_url(c.target, settings.allow_private_targets)
        # One bound for the whole attempt: connect, send, answer.
        async with asyncio.timeout(settings.delivery_timeout):
            async with session.post(url, data=body, headers=headers,
                                    allow_redirects=False) as response:
                status = response.status
                retry_after = response.headers.get("Retry-After")
                # Read a little even on success, so the connection can be reused.
                text = await response.content.read(BODY_LIMIT)
                if not 200 <= status < 300:
                    error = text.decode("utf-8", errors="replace")
    except TimeoutError:
        status, error = 0, f"timed out after {settings.delivery_timeout:g}s"
    except TargetRejected as exc:
        status, error = 0, str(exc)
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        status, error = 0, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    duration_ms = (time.perf_counter() - started) * 1000.0
    if error is not None:
        error = redact(error)
    return decide(c, settings, status=status, retry_after=retry_after,
                  attempted_at=attempted_at, duration_ms=duration_ms, error=error)


def decide(c: Claim, settings: Settings, *, status: int, retry_after: str | None,
           attempted_at: datetime, duration_ms: float, error: str | None) -> Outcome:
    """The outcome of an attempt that got `status` (0: no response), logged."""
    if 200 <= status < 300:
        outcome, retry_in = "succeeded", 0.0
    elif status == 410:
        outcome, retry_in = "failed", 0.0
    else:
        delay = next_delay(settings.retry_schedule, c.attempts, status=status,
                           retry_after=retry_after, cap=settings.retry_after_cap,
                           now=time.time())
        outcome, retry_in = ("failed", 0.0) if delay is None else ("pending", delay)
    log.info("delivery", extra={
        "subscription_id": c.subscription_id, "event": c.event, "delivery_id": c.id,
        "status": status, "duration_ms": round(duration_ms, 2), "attempt": c.attempts,
    })
    return Outcome(c, status, outcome, retry_in, attempted_at, duration_ms, error)


async def record(pool: AsyncConnectionPool, outcomes: Sequence[Outcome]) -> None:
    """Writes a batch of outcomes in one transaction: deliveries, attempts, subscriptions."""
    params = {"batch": json.dumps([
        [o.claim.id, o.claim.attempts, o.claim.subscription_id, o.status, o.outcome,
         o.retry_in, o.attempted_at.timestamp(), o.duration_ms, o.error]
        for o in outcomes])}
    gone = sorted({o.claim.subscription_id for o in outcomes if o.status == 410})
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(query("record"), params)
        if gone:
            await conn.execute(query("stop_gone"), {"subscription_ids": gone})


async def release(pool: AsyncConnectionPool, claims: Sequence[Claim]) -> None:
    """Gives back claims that will not be finished: due again now, attempt not counted."""
    if not claims:
        return
    async with pool.connection() as conn:
        await conn.execute(query("release"), {"ids": [c.id for c in claims],
                                              "attempts": [c.attempts for c in claims]})


class Recorder:
    """Collects finished attempts and writes them in batches, one batch at a time.

    While a batch is being written the next one accumulates, so under load each statement
    records many attempts, and when idle each is recorded at once.
    """

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool
        self._pending: list[Outcome] = []
        self._ready = asyncio.Event()
        self._closing = False
        self.recorded = 0

    def add(self, outcome: Outcome) -> None:
        """Queues one outcome for the next batch."""
        self._pending.append(outcome)
        self._ready.set()

    @property
    def backlog(self) -> int:
        """Outcomes not yet written."""
        return len(self._pending)

    async def run(self) -> None:
        """Writes batches until close(); a failed write is retried, never dropped."""
        backoff = 0.05
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            batch, self._pending = self._pending, []
            try:
                await record(self._pool, batch)
            except (psycopg.Error, OSError) as exc:
                # Unrecorded attempts are retried by lease expiry at worst; keep trying.
                log.warning("recording %d attempts failed, will retry: %s", len(batch), exc)
                self._pending[:0] = batch
                if self._closing and backoff > 2.0:
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            else:
                self.recorded += len(batch)
                backoff = 0.05

    def close(self) -> None:
        """Asks run() to return once everything queued is written."""
        self._closing = True
        self._ready.set()
