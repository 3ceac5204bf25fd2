"""Real HTTP receivers on 127.0.0.1 for tests: they record every request and answer
with whatever behaviour the test sets (echo the handshake secret, fail, hang, redirect).

    async with Receiver(behaviour=status(500)) as receiver:
        ...  # receiver.url, receiver.received, await receiver.wait_for(...)

The `receiver` fixture (tests/conftest.py) is one such receiver, echoing the handshake."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Behaviour = Callable[["Received"], Awaitable[web.StreamResponse]]


@dataclass
class Received:
    """One request as the receiver saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    # The live request: whether its client is still there (`request.transport`).
    request: web.Request | None = field(default=None, repr=False, compare=False)


async def echo_secret(req: Received) -> web.StreamResponse:
    """Answer the handshake the way a willing target does: 200, secret echoed."""
    headers = {}
    if "x-hook-secret" in req.headers:
        headers["X-Hook-Secret"] = req.headers["x-hook-secret"]
    return web.Response(status=200, headers=headers)


def status(code: int, headers: dict[str, str] | None = None, body: str = "") -> Behaviour:
    """Always answer `code`, echoing a handshake secret when one comes."""

    async def respond(req: Received) -> web.StreamResponse:
        h = dict(headers or {})
        if "x-hook-secret" in req.headers:
            h.setdefault("X-Hook-Secret", req.headers["x-hook-secret"])
        return web.Response(status=code, headers=h, text=body)

    return respond


async def serve(app: web.Application, port: int = 0, backlog: int = 128,
                **runner: Any) -> tuple[web.AppRunner, int]:
    """`app` served on 127.0.0.1:`port` (0: a free one): its runner, to clean up, and port.
    Used by Receiver and by bench's receiver process."""
    app_runner = web.AppRunner(app, access_log=None, **runner)
    await app_runner.setup()
    site = web.TCPSite(app_runner, "127.0.0.1", port, backlog=backlog)
    await site.start()
    return app_runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@dataclass
class Receiver:
    """A running receiver; `behaviour` may be swapped at any time. With
    `cancel_on_disconnect`, a behaviour still running when its client gives up is cancelled
    (as a real server would stop working for nobody)."""

    behaviour: Behaviour = echo_secret
    received: list[Received] = field(default_factory=list)
    url: str = ""
    cancel_on_disconnect: bool = False
    _runner: web.AppRunner | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self, path: str = "/hook") -> Receiver:
        app = web.Application(client_max_size=2**22)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, port = await serve(app, handler_cancellation=self.cancel_on_disconnect)
        self.url = f"http://127.0.0.1:{port}{path}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> Receiver:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        req = Received(request.method, request.path, dict(request.headers),
                       await request.read(), time.monotonic(), request)
        self.received.append(req)
        self._changed.set()
        return await self.behaviour(req)

    def deliveries(self) -> list[Received]:
        """The requests that were deliveries, not handshakes."""
        return [r for r in self.received if "webhook-id" in r.headers]

    async def wait_for(self, predicate: Callable[[Receiver], bool], timeout: float = 10.0
                       ) -> None:
        """Polls until `predicate(self)` holds; fails the test after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"receiver condition not met in {timeout}s; "
                                     f"got {len(self.received)} requests")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.2))


@asynccontextmanager
async def hanging_receiver() -> AsyncIterator[tuple[Receiver, asyncio.Event]]:
    """A receiver that answers nothing until the event is set (or the block ends)."""
    release = asyncio.Event()

    async def hang(req: Received) -> web.StreamResponse:
        await release.wait()
        return web.Response(status=200)

    async with Receiver(behaviour=hang) as hanging:
        try:
            yield hanging, release
        finally:
            release.set()
