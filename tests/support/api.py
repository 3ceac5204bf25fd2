"""A running API: the app served by uvicorn on 127.0.0.1:0, an HTTP client with a token,
a receiver for the handshake, direct database checks. The `api` fixture (tests/conftest.py)
is `api_for(db_url)`; a module changes its settings with
`pytestmark = pytest.mark.api_settings(verify_timeout=...)`."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import uvicorn
from litestar import Litestar

from service import tokens
from service.api.app import create_app
from service.config import Settings
from tests.support.receivers import Receiver


@contextlib.asynccontextmanager
async def serving(settings: Settings, app: Litestar | None = None, **kwargs: Any
                  ) -> AsyncIterator[str]:
    """The app (default: create_app(settings, **kwargs)) on a free loopback port; yields its URL."""
    app = app or create_app(settings, **kwargs)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None,
                            access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 15
    while not server.started:
        if task.done():
            task.result()
            raise AssertionError("uvicorn stopped before it started")
        if time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start in 15s")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@dataclass
class Api:
    """A running API with a client authenticated as `owner`."""

    url: str
    http: httpx.AsyncClient
    db_url: str
    token: str
    receiver: Receiver

    def auth(self, token: str | None = None) -> dict[str, str]:
        """Headers carrying `token` (default: this API's token)."""
        return {"Authorization": f"Bearer {token or self.token}"}

    async def request(self, method: str, path: str, *, token: str | None = None,
                      **kwargs: Any) -> httpx.Response:
        """A request with the token, unless headers are given."""
        headers = kwargs.pop("headers", None)
        if headers is None:
            headers = self.auth(token)
        return await self.http.request(method, path, headers=headers, **kwargs)

    def new_token(self, owner: str, tenant: str | None = None) -> str:
        """A fresh token for `owner`."""
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            return tokens.create(conn, owner, tenant)[1]

    async def create(self, events: str = "invoice.create", resource: str = "invoices",
                     target: str | None = None, token: str | None = None) -> dict[str, Any]:
        """A subscription created through the API (the receiver echoes the secret)."""
        response = await self.request("POST", "/api/v1/webhooks/", token=token, json={
            "resource": resource, "events": events, "target": target or self.receiver.url})
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    def sql(self, query: str, *params: object) -> list[tuple[Any, ...]]:
        """Rows of a query run directly against the test database."""
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            cur = conn.execute(query.encode(), params or None)
            return cur.fetchall() if cur.description else []


@contextlib.asynccontextmanager
async def api_for(db_url: str, **settings: Any) -> AsyncIterator[Api]:
    """An Api for the test database; settings default to private targets allowed."""
    settings.setdefault("allow_private_targets", True)
    settings.setdefault("verify_timeout", 2.0)
    async with Receiver() as receiver, \
            serving(Settings(database_url=db_url, **settings)) as url, \
            httpx.AsyncClient(base_url=url, timeout=30) as http:
        with psycopg.connect(db_url, autocommit=True) as conn:
            token = tokens.create(conn, "alice")[1]
        yield Api(url, http, db_url, token, receiver)


SUBSCRIPTION_FIELDS = {"id", "resource", "events", "target", "active", "last_status",
                       "last_success_at", "last_failure_at", "last_failure_content",
                       "filter", "ordering", "inactive_reason"}


def assert_error(response: httpx.Response, status: int, fragment: str = "") -> str:
    """The response is `status` with exactly {"error": str} containing `fragment`."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert isinstance(body["error"], str) and body["error"]
    assert fragment.lower() in body["error"].lower(), body["error"]
    return str(body["error"])


@contextlib.contextmanager
def background_api(settings: Settings) -> Iterator[tuple[str, str]]:
    """The app and a handshake-answering receiver served by an event loop in a thread, for
    synchronous tests (hypothesis, schemathesis); yields (API URL, receiver URL)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()
    urls: list[str] = []

    async def main() -> None:
        async with Receiver() as receiver, serving(settings) as url:
            urls[:] = [url, receiver.url]
            started.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not started.wait(0.05):
        assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
    try:
        yield urls[0], urls[1]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(20)
        loop.close()
