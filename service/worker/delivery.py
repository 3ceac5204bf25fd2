"""Deliveries: claim due ones with a lease, send one signed POST each, record the outcomes."""

from __future__ import annotations

import asyncio
import json
import logging
import re
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
from service.ssrf import TargetRejected
from service.worker.retry import next_delay
from service.worker.signing import message_id, signed_headers

log = logging.getLogger("webhooks.delivery")

# How much of a response body is read, and kept as last_failure_content; also the longest
# error text recorded, in characters.
BODY_LIMIT = 1024

_SURROGATES = re.compile("[\ud800-\udfff]")


def pg_text(value: str | bytes | None, limit: int = BODY_LIMIT) -> str | None:
    """Text that Postgres stores whatever a target sent: the one sanitizer of recorded text.

    Bytes are read as UTF-8 and anything invalid becomes U+FFFD, as do NUL (text and jsonb
    refuse it) and lone surrogates (which an HTTP library may use for undecodable header
    bytes); the result is cut to `limit` characters.
    """
    if value is None:
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if len(text) > limit:
        text = text[:limit]
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    return _SURROGATES.sub("\ufffd", text)


@dataclass(frozen=True)
class Claim:
    """A delivery this worker holds the lease of, with what sending it needs."""

    id: int
    attempts: int
    subscription_id: int
    owner: str
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


def saturated_owners(busy_owners: Mapping[str, int], per_owner: int | None) -> list[str]:
    """The owners with `per_owner` deliveries in flight (none when there is no cap)."""
    if per_owner is None:
        return []
    return [owner for owner, n in busy_owners.items() if n >= per_owner]


async def claim(pool: AsyncConnectionPool, *, limit: int, per_target: int,
                busy: Mapping[int, int], lease: float, scan: int,
                degraded: Collection[int] = (), per_owner: int | None = None,
                busy_owners: Mapping[str, int] | None = None) -> list[Claim]:
    """Claims up to `limit` due deliveries, committed before returning, in start order.

    `busy` maps subscription ids to deliveries this worker has in flight for them; none
    gets more than `per_target` in flight, and the `degraded` ones (whose last attempt
    failed) no more than one. `busy_owners` does the same per owner, capped at `per_owner`
    (None: no cap). Deliveries of inactive subscriptions are closed as failed and not
    returned.
    """
    owners = busy_owners or {}
    params = {
        "limit": limit,
        "scan": max(scan, limit),
        "per_target": per_target,
        "per_owner": per_owner if per_owner is not None else 2**31 - 1,
        "lease": lease,
        "busy_ids": list(busy),
        "busy_counts": list(busy.values()),
        "saturated": saturated(busy, per_target, degraded),
        "degraded": list(degraded),
        "owner_names": list(owners),
        "owner_counts": list(owners.values()),
        "saturated_owners": saturated_owners(owners, per_owner),
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
    now = time.time()  # anything raised before the try is a crash: the worker records it
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
                    # Raw bytes, as sent: never decompressed (none are asked for, and the
                    # session does not inflate), made storable by record().
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


def crashed(c: Claim, settings: Settings, exc: BaseException, attempted_at: datetime,
            duration_ms: float = 0.0) -> Outcome:
    """The outcome of an attempt that raised something unexpected: a failed attempt with no
    response (status 0), retried on the schedule like any other failure."""
    error = redact(f"attempt failed unexpectedly: {type(exc).__name__}: {exc}")
    return decide(c, settings, status=0, retry_after=None, attempted_at=attempted_at,
                  duration_ms=duration_ms, error=error)


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
    """Writes a batch of outcomes in one transaction: deliveries, attempts, subscriptions.

    Error texts (a target's bytes, library messages) pass pg_text() here, the one place
    where text bound for Postgres is made storable.
    """
    params = {"batch": json.dumps([
        [o.claim.id, o.claim.attempts, o.claim.subscription_id, o.status, o.outcome,
         o.retry_in, o.attempted_at.timestamp(), o.duration_ms, pg_text(o.error)]
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


def unreachable(exc: BaseException) -> bool:
    """Whether a failed write says the database is unreachable or busy (worth retrying the
    same statement later), not that this statement's data is refused."""
    if isinstance(exc, OSError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:
        # Client-side errors (a NUL in a parameter, say) are about the data.
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    # Connection, resources, shutdown, serialization and deadlock, system errors.
    return state.startswith(("08", "53", "57P", "40", "58"))


class Recorder:
    """Collects finished attempts and writes them in batches, one batch at a time.

    While a batch is being written the next one accumulates, so under load each statement
    records many attempts, and when idle each is recorded at once. A batch the database
    refuses (not a lost connection: bad data) is split in halves until the outcomes that
    can be written are; a single outcome that is still refused is logged and dropped (its
    delivery comes due again when its lease expires), so no outcome can wedge the others.
    """

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool
        self._pending: list[Outcome] = []
        self._writing: list[Outcome] = []  # taken for the write under way
        self._ready = asyncio.Event()
        self._closing = False
        self.recorded = 0
        self.dropped = 0

    def add(self, outcome: Outcome) -> None:
        """Queues one outcome for the next batch."""
        self._pending.append(outcome)
        self._ready.set()

    @property
    def backlog(self) -> int:
        """Outcomes not yet written."""
        return len(self._pending) + len(self._writing)

    async def run(self) -> None:
        """Writes batches until close(). While the database is unreachable the same outcomes
        are retried with backoff; refused ones are split and, alone, dropped.

        Safe to call again after it raised (a supervisor restarting it): a batch that was
        being written is queued again first.
        """
        if self._writing:
            self._pending[:0] = self._writing
            self._writing = []
        backoff = 0.05
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            self._writing, self._pending = self._pending, []
            left = await self._write(self._writing)
            self._writing = []
            if not left:
                backoff = 0.05
                continue
            # Unrecorded attempts are retried by lease expiry at worst; keep trying.
            self._pending[:0] = left
            if self._closing and backoff > 2.0:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _write(self, batch: list[Outcome]) -> list[Outcome]:
        """Writes `batch`, halving refused parts; returns what is left unwritten because the
        database could not be reached (empty when everything was written or dropped)."""
        chunks = [batch]  # a stack: the first half of a split is written first
        while chunks:
            chunk = chunks.pop()
            try:
                await record(self._pool, chunk)
            except Exception as exc:
                if unreachable(exc):
                    log.warning("recording %d attempts failed, will retry: %s",
                                sum(map(len, chunks)) + len(chunk), exc)
                    return chunk + [o for rest in reversed(chunks) for o in rest]
                if len(chunk) > 1:
                    half = len(chunk) // 2
                    chunks += [chunk[half:], chunk[:half]]
                    continue
                (o,) = chunk
                self.dropped += 1
                log.error("the attempt of delivery %d cannot be recorded and is dropped; its "
                          "lease brings the delivery back: %s", o.claim.id, redact(str(exc)),
                          extra={"delivery_id": o.claim.id,
                                 "subscription_id": o.claim.subscription_id})
            else:
                self.recorded += len(chunk)
        return []

    def close(self) -> None:
        """Asks run() to return once everything queued is written."""
        self._closing = True
        self._ready.set()
