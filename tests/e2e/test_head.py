"""HEAD on every GET route answers as GET does, without a body (health checks, uptime
monitors); a route without GET still answers 405 naming HEAD."""

from __future__ import annotations

import asyncio
import re
from urllib.parse import urlsplit

import httpx

from service.api.app import create_app
from service.config import Settings
from tests.support.api import Api, assert_error
from tests.support.net import free_port

# Path parameters filled in so that each route is reached (an unknown id answers 404 to
# GET and HEAD alike).
FILL = {"delivery_id": "1", "backfill_id": "1", "path": "openapi.json"}
STATIC = {"/dashboard/static/{name}": "app.js", "/schema/static/{name}": "swagger-ui.css"}
# Bodies that change from one request to the next: their lengths are not compared.
CHANGING = {"/metrics"}


def get_paths(webhook_id: int) -> list[str]:
    """Every GET route of the app, its parameters filled in."""
    paths = []
    for route in create_app(Settings()).routes:
        if "GET" not in getattr(route, "methods", ()):
            continue
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        if path in STATIC:
            path = path.replace("{name}", STATIC[path])
        path = path.replace("{webhook_id}", str(webhook_id))
        for name, value in FILL.items():
            path = path.replace("{" + name + "}", value)
        assert "{" not in path, path
        paths.append(path)
    return paths


async def test_head_answers_every_get_route_as_get_without_a_body(api: Api) -> None:
    sub = await api.create()
    paths = get_paths(sub["id"])
    assert {"/healthz", "/readyz", "/api/v1/webhooks", f"/api/v1/webhooks/{sub['id']}",
            "/dashboard", "/metrics"} <= set(paths)
    for path in paths:
        got = await api.request("GET", path)
        head = await api.request("HEAD", path)
        assert head.status_code == got.status_code, (path, head.status_code, got.text)
        assert head.status_code != 405, path
        assert head.content == b"", path
        assert head.headers.get("content-type") == got.headers.get("content-type"), path
        if path not in CHANGING and "content-length" in got.headers:
            assert head.headers["content-length"] == got.headers["content-length"], path


async def test_head_sends_no_body_on_the_wire(api: Api) -> None:
    # Two requests on one connection: the GET's answer follows the HEAD's headers at once.
    url = urlsplit(api.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), raw
    assert b"content-length: 15" in head.lower(), raw
    assert rest.startswith(b"HTTP/1.1 200"), raw
    assert rest.endswith(b'{"status":"ok"}'), raw


async def test_head_on_a_route_without_get_is_405(api: Api) -> None:
    sub = await api.create()
    response = await api.request("HEAD", f"/api/v1/webhooks/{sub['id']}/test")
    assert response.status_code == 405
    assert "HEAD" not in response.headers["allow"] and "POST" in response.headers["allow"]
    # A route with GET lists HEAD beside it.
    response = await api.request("DELETE", "/healthz")
    assert_error(response, 405, "method DELETE is not allowed")
    assert "HEAD" in response.headers["allow"].split(", ")


async def test_head_on_the_workers_metrics_and_liveness() -> None:
    from service.worker.metrics import WorkerMetrics

    port = free_port()
    server = WorkerMetrics().serve(port, liveness=lambda: (200, {"status": "ok"}))
    try:
        for path in ("/metrics", "/livez", "/nothing"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"HEAD {path} HTTP/1.0\r\n\r\n".encode())
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), 10)  # HTTP/1.0: closed after
            writer.close()
            head, _, rest = raw.partition(b"\r\n\r\n")
            async with httpx.AsyncClient() as http:
                got = await http.get(f"http://127.0.0.1:{port}{path}")
            assert head.startswith(f"HTTP/1.0 {got.status_code}".encode()), raw
            assert f"content-type: {got.headers['content-type']}".encode() in head.lower()
            assert rest == b"", raw
    finally:
        server.shutdown()
        server.server_close()
