"""Spans of the API's requests, through Litestar's OpenTelemetry integration, when
OpenTelemetry is wanted and installed (service.otel); otherwise nothing is imported."""

from __future__ import annotations

from typing import Any

from service import otel


def plugins() -> list[Any]:
    """The app's OpenTelemetry plugin, or none."""
    provider = otel.provider("webhooks-api")
    if provider is None:
        return []
    from litestar.plugins.opentelemetry import OpenTelemetryConfig, OpenTelemetryPlugin

    return [OpenTelemetryPlugin(OpenTelemetryConfig(tracer_provider=provider))]
