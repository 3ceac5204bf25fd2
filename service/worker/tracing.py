"""The trace of each attempt: every POST carries `traceparent` (and the writer's
`tracestate`) continuing the writing transaction's trace, with a span id of its own
(service.tracecontext). With OpenTelemetry wanted (service.otel), each attempt is also a
CLIENT span, a child of the writer's span, following OpenTelemetry's HTTP client
conventions, and each fan-out that finds changes a messaging `process` span.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any, Protocol

from yarl import URL

from service import otel, tracecontext


class Claim(Protocol):
    """What an attempt's trace reads of its claim (service.worker.delivery.Claim): the
    tracer stays below the delivery that calls it."""

    @property
    def id(self) -> int: ...
    @property
    def attempts(self) -> int: ...
    @property
    def subscription_id(self) -> int: ...
    @property
    def event(self) -> str: ...
    @property
    def created_at(self) -> datetime | None: ...
    @property
    def traceparent(self) -> str | None: ...
    @property
    def tracestate(self) -> str | None: ...


class Attempt:
    """One attempt's trace headers; `end` is told how it went (a no-op here)."""

    __slots__ = ("headers",)

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers

    def end(self, status: int, error_type: str | None) -> None:
        """The attempt is over: `status` (0: no response), `error_type` when it failed."""


class Tracer:
    """Trace headers only: nothing is exported."""

    def attempt(self, c: Claim, url: URL) -> Attempt:
        parent = tracecontext.parent_of(c.id, c.created_at, c.traceparent, c.tracestate)
        return Attempt(tracecontext.headers(parent, tracecontext.new_span_id()))

    def fanout(self, started_ns: int, taken: int, changes: int, created: int) -> None:
        """A fan-out that started at `started_ns` (time.time_ns) is over."""


def redacted(url: URL) -> str:
    """`url.full` as the conventions want it: no user info, query values replaced."""
    if url.user is not None or url.password is not None:
        url = url.with_user(None)
    if url.query_string:
        url = url.with_query([(key, "REDACTED") for key in url.query])
    return str(url)


class OtelAttempt(Attempt):
    __slots__ = ("span",)

    def __init__(self, headers: dict[str, str], span: Any) -> None:
        super().__init__(headers)
        self.span = span

    def end(self, status: int, error_type: str | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        if status:
            self.span.set_attribute("http.response.status_code", status)
        if error_type is None and status >= 400:
            error_type = str(status)
        if error_type is not None:
            self.span.set_attribute("error.type", error_type)
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()


class OtelTracer(Tracer):
    """Exports a CLIENT span per attempt and a CONSUMER span per fan-out."""

    def __init__(self, provider: Any) -> None:
        self._tracer = provider.get_tracer("service.worker")

    def attempt(self, c: Claim, url: URL) -> Attempt:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

        parent = tracecontext.parent_of(c.id, c.created_at, c.traceparent, c.tracestate)
        # The writer's span, or, for a delivery whose writer set none, a stand-in whose
        # trace is the delivery's own: its attempts share one trace.
        remote = SpanContext(int(parent.trace_id, 16),
                             int(parent.span_id or parent.trace_id[:16], 16),
                             is_remote=True, trace_flags=TraceFlags(int(parent.flags, 16)))
        context = trace.set_span_in_context(NonRecordingSpan(remote))
        attributes: dict[str, Any] = {
            "http.request.method": "POST",
            "url.full": redacted(url),
            "server.address": url.host or "",
            "server.port": url.port or 0,
            "webhooks.delivery.id": c.id,
            "webhooks.subscription.id": c.subscription_id,
            "webhooks.event": c.event,
        }
        if c.attempts > 1:
            attributes["http.request.resend_count"] = c.attempts - 1
        span = self._tracer.start_span("POST", context=context, kind=SpanKind.CLIENT,
                                       attributes=attributes)
        own = span.get_span_context()
        headers = tracecontext.headers(parent, format(own.span_id, "016x"),
                                       format(int(own.trace_flags), "02x"))
        return OtelAttempt(headers, span)

    def fanout(self, started_ns: int, taken: int, changes: int, created: int) -> None:
        """A CONSUMER span for a fan-out that found changes (one that found none, as most
        polls of a quiet outbox, makes none)."""
        if not changes:
            return
        from opentelemetry.trace import SpanKind

        span = self._tracer.start_span(
            "process webhooks.outbox", kind=SpanKind.CONSUMER, start_time=started_ns,
            attributes={"messaging.system": "postgresql",
                        "messaging.operation.type": "process",
                        "messaging.operation.name": "process",
                        "messaging.destination.name": "webhooks.outbox",
                        "messaging.batch.message_count": changes,
                        "webhooks.outbox.statements": taken,
                        "webhooks.deliveries.created": created})
        span.end()


@cache
def tracer() -> Tracer:
    """This process's tracer: exporting when OpenTelemetry is wanted and installed."""
    provider = otel.provider("webhooks-worker")
    return Tracer() if provider is None else OtelTracer(provider)
