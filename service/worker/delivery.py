"""Deliveries: what a claim returns, one signed POST each, and what follows.

The claim's parameters are built in pacing.py; the outcomes are written by the recorder
(recorder.py)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from yarl import URL

from service.config import Settings
from service.curl import AttemptError, CurlClient
from service.http import check_literal
from service.logs import redact
from service.outcomes import Answer, classify
from service.ssrf import TargetRejected
from service.store import Store
from service.worker.retry import next_delay
from service.worker.signing import message_id, signed_headers
from service.worker.tracing import Attempt, Tracer

# Trace headers without exporting spans: the tracer of callers that give none.
TRACE_HEADERS_ONLY = Tracer()

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


@dataclass(frozen=True, slots=True)
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
    # The secret before the last rotation, as stored, while it still signs (the overlap).
    previous_secret: str | None = field(default=None, repr=False)
    # The delivery's partition key: the recorder finds its row in one partition.
    created_at: datetime | None = None
    # A strict subscription's: its outcome is recorded at once, since the record unparks
    # the next delivery (the recorder lets others gather for a moment when few).
    strict: bool = False
    # The writing transaction's trace context, as it set it (service.tracecontext).
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """One finished attempt, ready to be recorded."""

    claim: Claim
    status: int  # HTTP status, 0 when no response came
    outcome: str  # the delivery's new status: succeeded, failed or pending (retry)
    retry_in: float  # seconds until the retry, when outcome is pending
    attempted_at: float  # when the attempt started, seconds since the epoch
    duration_ms: float
    error: str | None  # the error, or the start of the response body, for failures


def in_start_order(rows: Sequence[Claim]) -> list[Claim]:
    """The active claims of a claim query's rows, in the order their attempts start."""
    # RETURNING has no order: attempts of one subscription start in event order.
    return sorted((c for c in rows if c.active), key=lambda c: (c.due, c.id))


def inactive(rows: Sequence[Claim]) -> list[int]:
    """The subscriptions the claim found inactive (it closed those rows), in id order."""
    return sorted({c.subscription_id for c in rows if not c.active})


def leased(rows: Sequence[Sequence[Any]] | None) -> list[Claim]:
    """The deliveries a fan-out made leased (FanoutBatch.claims: JSON arrays of Claim's
    fields, timestamps in ISO 8601), as claims."""
    return [Claim(d, attempts, sid, owner, active, target, secret, event, body,
                  datetime.fromisoformat(due), previous, datetime.fromisoformat(created),
                  traceparent=traceparent, tracestate=tracestate)
            for (d, attempts, sid, owner, active, target, secret, event, body, due, previous,
                 created, traceparent, tracestate) in rows or ()]


@lru_cache(maxsize=4096)
def target_url(target: str, allow_private: bool) -> URL:
    """The parsed target, if its host is not a forbidden IP literal (names are checked by the
    resolver at connection time). Cached: a worker sends to few targets, many times."""
    url = URL(target)
    check_literal(url.host, allow_private)
    return url


async def send(session: CurlClient, c: Claim, secret: str, settings: Settings,
               previous: str | None = None, *,
               expired: Callable[[], bool] | None = None,
               tracer: Tracer | None = None) -> Outcome:
    """Makes one POST attempt of the claimed delivery, signed with `secret` (the plain one)
    and, during a rotation's overlap, with `previous` (the plain secret before it) too.

    The attempt is bounded by settings.delivery_timeout: by a timer of its own, or, when
    `expired` is given, by the caller, who cancels the task at the deadline and answers
    True to `expired()` then (the worker's senders: one watchdog for all, no timer per
    attempt). Returns the attempt's outcome: what the delivery becomes and when it is
    retried. Its POST carries the trace headers of the attempt's span (`tracer`:
    service.worker.tracing).
    """
    body = c.body.encode()
    now = time.time()  # anything raised before the try is a crash: the worker records it
    headers = signed_headers(secret, message_id(c.id), int(now), body, previous)
    started = time.perf_counter()
    status = 0
    error: str | None = None
    error_type: str | None = None
    retry_after: str | None = None
    span: Attempt | None = None
    try:
        url = target_url(c.target, settings.allow_private_targets)
        span = (tracer or TRACE_HEADERS_ONLY).attempt(c, url)
        headers.update(span.headers)
        if expired is None:
            # One bound for the whole attempt: connect, send, answer.
            async with asyncio.timeout(settings.delivery_timeout):
                status, retry_after, error = await _post(session, url, body, headers,
                                                         settings.delivery_timeout)
        else:
            try:
                status, retry_after, error = await _post(session, url, body, headers,
                                                         settings.delivery_timeout)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                # A cancellation that is not (only) the deadline's goes on.
                if not expired() or task is None or task.uncancel() > 0:
                    raise
                raise TimeoutError from None
    except TimeoutError:
        status, error = 0, f"timed out after {settings.delivery_timeout:g}s"
        error_type = "timeout"
    except (TargetRejected, AttemptError) as exc:
        status, error, error_type = 0, str(exc), type(exc).__name__
    except (OSError, ValueError) as exc:
        status, error = 0, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        error_type = type(exc).__name__
    finally:
        if span is not None:
            span.end(status, error_type)
    duration_ms = (time.perf_counter() - started) * 1000.0
    if error is not None:
        error = redact(error)
    return decide(c, settings, status=status, retry_after=retry_after,
                  attempted_at=now, duration_ms=duration_ms, error=error)


async def _post(session: CurlClient, url: URL, body: bytes, headers: dict[str, str],
                timeout: float) -> tuple[int, str | None, str | None]:
    """One POST: (status, Retry-After, the start of the body when not 2xx)."""
    status, retry_after, text = await session.post(
        str(url), url.raw_host or "", url.port or 0, body,
        [f"{name}: {value}" for name, value in headers.items()], timeout)
    if 200 <= status < 300:
        return status, retry_after, None
    # Raw bytes, as sent: never decompressed (none are asked for, and the client does not
    # inflate), made storable by record().
    return status, retry_after, text.decode("utf-8", errors="replace")


def crashed(c: Claim, settings: Settings, exc: BaseException, attempted_at: float,
            duration_ms: float = 0.0) -> Outcome:
    """The outcome of an attempt that raised something unexpected: a failed attempt with no
    response (status 0), retried on the schedule like any other failure."""
    error = redact(f"attempt failed unexpectedly: {type(exc).__name__}: {exc}")
    return decide(c, settings, status=0, retry_after=None, attempted_at=attempted_at,
                  duration_ms=duration_ms, error=error)


def decide(c: Claim, settings: Settings, *, status: int, retry_after: str | None,
           attempted_at: float, duration_ms: float, error: str | None) -> Outcome:
    """The outcome of an attempt that got `status` (0: no response), logged."""
    answer = classify(status)
    if answer is Answer.SUCCESS:
        outcome, retry_in = "succeeded", 0.0
    elif answer is Answer.GONE:  # the target wants no more: no retry
        outcome, retry_in = "failed", 0.0
    else:
        delay = next_delay(settings.retry_schedule, c.attempts, status=status,
                           retry_after=retry_after, cap=settings.retry_after_cap,
                           now=time.time())
        outcome, retry_in = ("failed", 0.0) if delay is None else ("pending", delay)
    # Successes are the hot path: a line each at DEBUG; failed attempts at INFO.
    level = logging.DEBUG if outcome == "succeeded" else logging.INFO
    if log.isEnabledFor(level):
        log.log(level, "delivery", extra={
            "subscription_id": c.subscription_id, "event": c.event, "delivery_id": c.id,
            "status": status, "duration_ms": round(duration_ms, 2), "attempt": c.attempts,
        })
    return Outcome(c, status, outcome, retry_in, attempted_at, duration_ms, error)


async def release(store: Store, claims: Sequence[Claim]) -> None:
    """Gives back claims that will not be finished: due again at once in their place (the
    time they were due), attempt not counted."""
    if not claims:
        return
    await store.release(ids=[c.id for c in claims], attempts=[c.attempts for c in claims],
                        dues=[c.due for c in claims])
