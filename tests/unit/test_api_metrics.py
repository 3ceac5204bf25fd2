"""The API's metrics without serving them: each app counts in a registry of its own (GET
/metrics over HTTP: tests/e2e/test_api_metrics.py)."""

from __future__ import annotations

from service.api.app import create_app
from service.config import Settings

# Never connected to: building an app opens no pool (its lifespan, which does, never runs).
DB_URL = "postgresql://nobody@127.0.0.1:1/none"


def test_every_app_has_its_own_registry() -> None:
    apps = [create_app(Settings(database_url=DB_URL)) for _ in range(5)]
    registries = {id(app.state.metrics.registry) for app in apps}
    assert len(registries) == 5
    apps[0].state.metrics.handshake("verified")
    assert apps[1].state.metrics.handshakes.labels("verified")._value.get() == 0
