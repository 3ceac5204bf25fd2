"""OpenTelemetry, when it is wanted: with the optional extra installed (`pip install
'pg-webhooks[otel]'`) and an OTLP endpoint in the standard variables
(`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), the API and the
worker export spans over OTLP/HTTP (docs/operations.md, "Tracing"). Otherwise nothing of
OpenTelemetry is imported: `wanted()` reads the environment only, and `provider()` is
called only when it says yes.
"""

from __future__ import annotations

import logging
import os
from functools import cache
from typing import Any

log = logging.getLogger("webhooks")

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def wanted() -> bool:
    """Whether the standard variables ask for spans to be exported."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(os.environ.get(name, "").strip() for name in _ENDPOINTS)


@cache
def provider(default_name: str) -> Any | None:
    """This process's tracer provider exporting over OTLP/HTTP (batched; flushed at exit),
    named by OTEL_SERVICE_NAME, else `default_name`; None when OpenTelemetry is not
    wanted or the extra is not installed (said once)."""
    if not wanted():
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("an OTLP endpoint is set but OpenTelemetry is not installed: no spans "
                    "are exported (pip install 'pg-webhooks[otel]')")
        return None
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: default_name}
    tracer_provider = TracerProvider(resource=Resource.create(attributes))
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return tracer_provider
