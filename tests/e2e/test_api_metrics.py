"""GET /metrics on the API: request counts by route template and status, latency, handshake
outcomes; no token, secret or target in any label (a registry per app:
tests/unit/test_api_metrics.py)."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from service import store, tokens
from service.config import Settings
from tests.support.api import Api, serving
from tests.support.receivers import Received, status

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


pytestmark = pytest.mark.api_settings(verify_timeout=5.0)


async def scrape(api: Api | httpx.AsyncClient) -> tuple[str, Samples]:
    http = api.http if isinstance(api, Api) else api
    response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return response.text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


async def test_metrics_names_and_request_counts(api: Api) -> None:
    text, before = await scrape(api)
    for name in ("webhooks_api_requests_total", "webhooks_api_request_duration_seconds",
                 "webhooks_handshakes_total"):
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
    for outcome in ("verified", "refused", "timeout", "unreachable"):
        assert ("webhooks_handshakes_total", frozenset({("outcome", outcome)})) in before
    created = await api.create()
    for _ in range(3):
        assert (await api.request("GET", f"/api/v1/webhooks/{created['id']}/")).status_code == 200
    assert (await api.request("GET", "/api/v1/webhooks/999999")).status_code == 404
    assert (await api.request("GET", "/api/v1/webhooks", token="wht_" + "x" * 43)
            ).status_code == 401
    _, after = await scrape(api)
    one = "/api/v1/webhooks/{webhook_id}"
    assert value(after, "webhooks_api_requests_total", path=one, method="GET",
                 status_code="200") == 3
    assert value(after, "webhooks_api_requests_total", path=one, status_code="404") == 1
    assert value(after, "webhooks_api_requests_total", path="/api/v1/webhooks",
                 method="POST", status_code="201") == 1
    assert value(after, "webhooks_api_requests_total", path="/api/v1/webhooks",
                 status_code="401") == 1
    assert value(after, "webhooks_api_request_duration_seconds_count", path=one) == 4
    assert value(after, "webhooks_handshakes_total", outcome="verified") == 1
    # Route templates, never raw paths: the id appears in no label.
    labels = {v for (_, ls) in after for _, v in ls}
    assert not any(str(created["id"]) in v.split("/") for v in labels)
    assert "/api/v1/webhooks/999999" not in labels


async def test_handshake_outcomes_are_counted(api: Api) -> None:
    async def silent(req: Received) -> web.StreamResponse:
        return web.Response(status=200)

    for behaviour in (silent, status(500)):
        api.receiver.behaviour = behaviour
        response = await api.request("POST", "/api/v1/webhooks", json={
            "resource": "invoices", "events": "create", "target": api.receiver.url})
        assert response.status_code == 400
    response = await api.request("POST", "/api/v1/webhooks", json={
        "resource": "invoices", "events": "create", "target": "http://127.0.0.1:1/hook"})
    assert response.status_code == 400
    text, samples = await scrape(api)
    assert value(samples, "webhooks_handshakes_total", outcome="refused") == 2
    assert value(samples, "webhooks_handshakes_total", outcome="unreachable") == 1
    assert value(samples, "webhooks_handshakes_total", outcome="verified") == 0
    # No target, token or secret in the exposition.
    sent = [r.headers["x-hook-secret"] for r in api.receiver.received]
    assert api.receiver.url not in text and "127.0.0.1" not in text
    assert api.token not in text and not any(secret in text for secret in sent)


async def test_metrics_need_no_token_and_are_not_in_the_schema(api: Api) -> None:
    assert (await api.http.get("/metrics/")).status_code == 200
    doc = (await api.http.get("/schema/openapi.json")).json()
    assert "/metrics" not in doc["paths"]


async def test_server_errors_and_requests_in_progress(db_url: str) -> None:
    # The database goes away: /readyz and the list answer 503, counted as errors too, and
    # no request stays counted as in progress once answered.
    pool = store.make_pool(db_url)
    await pool.open(wait=True)
    async with serving(Settings(database_url=db_url), pool=pool) as url, \
            httpx.AsyncClient(base_url=url) as http:
        await pool.close()
        assert (await http.get("/readyz")).status_code == 503
        for _ in range(2):
            response = await http.get("/api/v1/webhooks", headers={
                "Authorization": "Bearer " + tokens.new_token()})
            assert response.status_code == 503
        assert (await http.get("/healthz")).status_code == 200
        _, samples = await scrape(http)
    errors = "webhooks_api_requests_error_total"
    assert value(samples, errors, path="/readyz", status_code="503", method="GET") == 1
    assert value(samples, errors, path="/api/v1/webhooks", status_code="503") == 2
    assert value(samples, errors, path="/healthz") == 0
    assert value(samples, "webhooks_api_requests_total", path="/api/v1/webhooks",
                 status_code="503") == 2
    assert value(samples, "webhooks_api_request_duration_seconds_count",
                 path="/api/v1/webhooks") == 2
    assert value(samples, "webhooks_api_request_duration_seconds_sum",
                 path="/api/v1/webhooks") > 0
    gauge = "webhooks_api_requests_in_progress"
    for path in ("/readyz", "/api/v1/webhooks", "/healthz"):
        assert value(samples, gauge, path=path) == 0, path
    assert value(samples, gauge, path="/metrics") == 1  # the scrape itself
