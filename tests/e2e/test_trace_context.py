"""Trace context from the writer's transaction to the receiver: `SET LOCAL
webhooks.traceparent` (and `webhooks.tracestate`) reaches every attempt's POST as
`traceparent` with the writer's trace id and a span id of the attempt's own; without one,
each delivery has a trace of its own, shared by its retries; a malformed value is ignored.
With OpenTelemetry wanted (an OTLP endpoint set), the worker exports a CLIENT span per
attempt, a child of the writer's span, and a CONSUMER span per fan-out, and the API its
requests' spans; without OpenTelemetry installed, nothing of it is imported."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import httpx
import psycopg
from aiohttp import web

from service.tracecontext import delivery_trace_id, parse_traceparent
from tests.support.net import free_port
from tests.support.receivers import Received, Receiver, serve
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, running_worker

WRITER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
WRITER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{WRITER_TRACE}-{WRITER_SPAN}-01"


def traced(req: Received) -> tuple[str, str, str]:
    parsed = parse_traceparent(req.headers.get("traceparent"))
    assert parsed is not None, req.headers
    return parsed


def fail_first(code: int = 500) -> Any:
    """Answers `code` to the first delivery, then 200."""
    seen: list[int] = []

    async def respond(req: Received) -> web.StreamResponse:
        if "webhook-id" in req.headers:
            seen.append(1)
            if len(seen) == 1:
                return web.Response(status=code)
        return web.Response(status=200)

    return respond


async def test_the_writers_trace_reaches_every_attempt(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    receiver.behaviour = fail_first()
    subscribe(conn, receiver.url, events=["invoice.create"])
    async with running_worker(db_url):
        with psycopg.connect(db_url) as writer:
            writer.execute(f"SET LOCAL webhooks.traceparent = '{TRACEPARENT}'")
            writer.execute("SET LOCAL webhooks.tracestate = 'vendor=abc,other=x'")
            add_invoice(writer, "INV-TRACED")
            writer.commit()
        await receiver.wait_for(lambda r: len(r.deliveries()) == 2)
    first, second = receiver.deliveries()
    assert first.headers["webhook-id"] == second.headers["webhook-id"]  # a retry
    spans = set()
    for req in (first, second):
        trace_id, span_id, flags = traced(req)
        assert trace_id == WRITER_TRACE and flags == "01"
        assert span_id != WRITER_SPAN
        spans.add(span_id)
        assert req.headers["tracestate"] == "vendor=abc,other=x"
    assert len(spans) == 2  # a span id of each attempt's own


async def test_without_a_trace_each_delivery_has_its_own_shared_by_its_retries(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    receiver.behaviour = fail_first()
    subscribe(conn, receiver.url, events=["invoice.create"])
    async with running_worker(db_url):
        add_invoice(conn, "INV-A")
        add_invoice(conn, "INV-B")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 3)
    by_delivery: dict[str, set[str]] = {}
    for req in receiver.deliveries():
        trace_id, _, flags = traced(req)
        assert flags == "01" and "tracestate" not in req.headers
        by_delivery.setdefault(req.headers["webhook-id"], set()).add(trace_id)
    assert len(by_delivery) == 2 and all(len(t) == 1 for t in by_delivery.values())
    assert len(set.union(*by_delivery.values())) == 2  # one trace per delivery
    # Derived from the delivery, so any worker continues the same trace.
    for msg_id, (trace_id,) in ((k, tuple(v)) for k, v in by_delivery.items()):
        number = int(msg_id.removeprefix("msg_"))
        [(created_at,)] = conn.execute("SELECT created_at FROM webhooks.deliveries"
                                       " WHERE id = %s", (number,)).fetchall()
        assert trace_id == delivery_trace_id(number, created_at)


async def test_a_malformed_trace_is_ignored_and_never_fails_the_writer(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    subscribe(conn, receiver.url, events=["invoice.create"])
    bad = [f"00-{WRITER_TRACE}-{WRITER_SPAN}-01\r\nX-Injected: yes",  # a header line
           "00-" + "0" * 32 + f"-{WRITER_SPAN}-01",  # the invalid all-zero trace id
           f"ff-{WRITER_TRACE}-{WRITER_SPAN}-01", "hello", "x" * 10_000]
    async with running_worker(db_url):
        for n, value in enumerate(bad):
            with psycopg.connect(db_url) as writer:
                writer.execute("SELECT set_config('webhooks.traceparent', %s, true)", (value,))
                writer.execute("SELECT set_config('webhooks.tracestate', %s, true)",
                               ("a=1\nX-Injected: yes" if n % 2 else "k=" + "v" * 600,))
                add_invoice(writer, f"INV-BAD-{n}")
                writer.commit()
        await receiver.wait_for(lambda r: len(r.deliveries()) == len(bad))
    for req in receiver.deliveries():
        assert "x-injected" not in {k.lower() for k in req.headers}
        trace_id, _, _ = traced(req)
        assert trace_id != WRITER_TRACE and "tracestate" not in req.headers


class Collector:
    """An OTLP/HTTP trace collector on 127.0.0.1: decodes every export it receives."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Collector:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner, port = await serve(app)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _export(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            service = {a.key: a.value.string_value
                       for a in resource_spans.resource.attributes}.get("service.name")
            for scope in resource_spans.scope_spans:
                self.spans.extend((service, span) for span in scope.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def find(self, predicate: Any) -> list[Any]:
        return [span for service, span in self.spans if predicate(service, span)]


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        value = a.value
        out[a.key] = value.int_value if value.HasField("int_value") else value.string_value
    return out


async def test_spans_are_exported_over_otlp(db_url: str, conn: psycopg.Connection) -> None:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    async with Collector() as collector, Receiver() as receiver:
        receiver.behaviour = fail_first(503)
        subscribe(conn, receiver.url + "?token=hush", events=["invoice.create"])
        port = free_port()
        env = {**os.environ, "DATABASE_URL": db_url, "WEBHOOKS_ALLOW_PRIVATE_TARGETS": "true",
               "WEBHOOKS_RETRY_SCHEDULE": "50ms", "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
               "OTEL_SERVICE_NAME": "webhooks-test", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        process = subprocess.Popen([sys.executable, "-m", "service", "run", "--port",
                                    str(port)], env=env, stderr=subprocess.DEVNULL)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if (await client.get("/healthz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < deadline, "webhooks run did not start"
                    await asyncio.sleep(0.1)
                with psycopg.connect(db_url) as writer:
                    writer.execute(f"SET LOCAL webhooks.traceparent = '{TRACEPARENT}'")
                    add_invoice(writer, "INV-OTEL")
                    writer.commit()
                await receiver.wait_for(lambda r: len(r.deliveries()) == 2, timeout=30)

                def exported() -> bool:
                    return (len(collector.find(lambda s, span: span.name == "POST")) >= 2
                            and bool(collector.find(
                                lambda s, span: span.kind == Span.SPAN_KIND_CONSUMER))
                            and bool(collector.find(
                                lambda s, span: span.kind == Span.SPAN_KIND_SERVER)))
                while not exported():
                    assert time.monotonic() < deadline + 30, collector.spans
                    await asyncio.sleep(0.1)
        finally:
            process.terminate()
            process.wait(timeout=30)
    attempts = sorted(collector.find(lambda s, span: span.name == "POST"),
                      key=lambda span: span.start_time_unix_nano)
    sent = [traced(req) for req in receiver.deliveries()]
    for n, (span, (trace_id, span_id, _)) in enumerate(zip(attempts, sent, strict=True)):
        assert span.kind == Span.SPAN_KIND_CLIENT
        assert span.trace_id.hex() == WRITER_TRACE == trace_id
        assert span.parent_span_id.hex() == WRITER_SPAN  # a child of the writer's span
        assert span.span_id.hex() == span_id  # the traceparent sent is the attempt's span
        found = attributes(span)
        assert found["http.request.method"] == "POST"
        assert found["url.full"].endswith("/hook?token=REDACTED")
        assert found["server.address"] == "127.0.0.1"
        assert found["server.port"] == int(receiver.url.rsplit(":", 1)[1].split("/")[0])
        assert found["http.response.status_code"] == (503 if n == 0 else 200)
        assert ("error.type" in found) == (n == 0)
        assert found.get("http.request.resend_count", 0) == n
    assert {s for s, _ in collector.spans} == {"webhooks-test"}
    consumer = collector.find(lambda s, span: span.kind == Span.SPAN_KIND_CONSUMER)[0]
    assert attributes(consumer)["messaging.operation.type"] == "process"
    # The API's requests, through Litestar's OpenTelemetry integration.
    served = collector.find(lambda s, span: span.kind == Span.SPAN_KIND_SERVER)
    assert any("/healthz" in span.name or attributes(span).get("url.path") == "/healthz"
               or attributes(span).get("http.target") == "/healthz" for span in served), \
        [(span.name, attributes(span)) for span in served]


def test_without_opentelemetry_nothing_of_it_is_imported(db_url: str) -> None:
    # As an install without the extra: every import of opentelemetry fails, an OTLP
    # endpoint is set all the same, and the API and a worker's tracer still work.
    script = textwrap.dedent("""
        import sys
        from importlib.abc import MetaPathFinder

        class NoOtel(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "opentelemetry":
                    raise ModuleNotFoundError(name)
                return None

        sys.meta_path.insert(0, NoOtel())
        from litestar.testing import TestClient
        from service.api.app import create_app
        from service.config import Settings
        from service.worker import tracing

        assert type(tracing.tracer()) is tracing.Tracer
        with TestClient(create_app(Settings(database_url=sys.argv[1]))) as client:
            assert client.get("/healthz").status_code == 200
        loaded = [m for m in sys.modules if m.split(".")[0] == "opentelemetry"]
        assert not loaded, loaded
        print("ok")
    """)
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    done = subprocess.run([sys.executable, "-c", script, db_url], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
