"""W3C Trace Context for deliveries: the writer's `traceparent` and `tracestate`, as its
transaction set them (`SET LOCAL webhooks.traceparent = '00-...'`), checked, and the
headers each attempt's POST carries (docs/deliveries.md, "Trace context").

Values come from any writer, so nothing here trusts them: only a well-formed traceparent
is used (anything else is ignored, as if none was set) and a tracestate only when it is at
most 512 bytes of printable ASCII, so no value can add a header line or break the request.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from datetime import datetime

# version-trace id-parent id-flags; a version after 00 may carry more fields after them.
_TRACEPARENT = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x21-\x7e]*)?")
_TRACESTATE = re.compile(r"[\x20-\x7e]*")
MAX_TRACESTATE = 512
SAMPLED = "01"


@dataclass(frozen=True, slots=True)
class Parent:
    """Where an attempt's span sits: the writer's trace, or the delivery's own."""

    trace_id: str  # 32 lowercase hex digits
    span_id: str | None  # the writer's span (16 hex digits); None: no span of the writer's
    flags: str  # 2 hex digits
    tracestate: str | None


def parse_traceparent(value: str | None) -> tuple[str, str, str] | None:
    """(trace id, parent span id, flags) of a well-formed traceparent, else None."""
    if not value:
        return None
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == "0" * 32 \
            or span_id == "0" * 16:
        return None
    return trace_id, span_id, flags


def clean_tracestate(value: str | None) -> str | None:
    """The tracestate to send: printable ASCII of at most 512 bytes, else None."""
    if not value:
        return None
    value = value.strip()
    if not value or len(value) > MAX_TRACESTATE or not _TRACESTATE.fullmatch(value):
        return None
    return value


def delivery_trace_id(delivery_id: int, created_at: datetime | None) -> str:
    """The trace of a delivery whose writer set none: derived from the delivery, so that
    every attempt, on any worker, continues the same one."""
    seed = f"webhooks-delivery:{delivery_id}:{created_at.isoformat() if created_at else ''}"
    return hashlib.blake2b(seed.encode(), digest_size=16).hexdigest()


def parent_of(delivery_id: int, created_at: datetime | None, traceparent: str | None,
              tracestate: str | None) -> Parent:
    """The writer's trace when it set a well-formed one, else the delivery's own (sampled,
    so that a receiver's parent-based sampling keeps it)."""
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return Parent(delivery_trace_id(delivery_id, created_at), None, SAMPLED, None)
    trace_id, span_id, flags = parsed
    return Parent(trace_id, span_id, flags, clean_tracestate(tracestate))


def new_span_id() -> str:
    """A random span id (16 hex digits, never all zeros)."""
    while True:
        span = os.urandom(8).hex()
        if span != "0" * 16:
            return span


def headers(parent: Parent, span_id: str, flags: str | None = None) -> dict[str, str]:
    """The trace headers of one attempt whose span is `span_id`."""
    out = {"traceparent": f"00-{parent.trace_id}-{span_id}-{flags or parent.flags}"}
    if parent.tracestate:
        out["tracestate"] = parent.tracestate
    return out
