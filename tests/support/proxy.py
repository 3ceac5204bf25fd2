"""A TCP proxy on 127.0.0.1 between the service and PostgreSQL, in pure asyncio, that the
tests make fail the ways a network fails without an error: it forwards, hangs (keeps its
connections open and forwards nothing, as a hung pooler or a vanished host behind a NAT
looks from the client), or resets them. No kernel rules.

    with Proxy(port_of(db_url)) as proxy:
        url = proxy.url(db_url)       # the same database, through the proxy
        proxy.hang()                  # the connections made so far stop answering
        proxy.hang(new=True)          # ... and so do those made from now on
        proxy.forward(to_port=5433)   # new connections work again (to another server)
        proxy.reset()                 # every connection reset (RST)

It runs its own event loop in a thread, so a test's loop (or a blocking test) and the
proxy never wait on each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")

CHUNK = 65536


def port_of(url: str) -> int:
    """The port of a postgresql:// URL."""
    return urlsplit(url).port or 5432


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.pumps: list[asyncio.Task[None]] = []

    def stop(self) -> None:
        """Stops forwarding; both connections stay open."""
        for pump in self.pumps:
            pump.cancel()

    def close(self, reset: bool = False) -> None:
        self.stop()
        for writer in (self.client, self.server):
            if writer is None:
                continue
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()


class Proxy:
    """A proxy to 127.0.0.1:`to_port`, listening on a free port of 127.0.0.1."""

    def __init__(self, to_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.to_port = to_port
        self.hang_new = False
        self.links: set[_Link] = set()
        self.hung: set[_Link] = set()
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-proxy",
                                        daemon=True)
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, host, 0))
        self.port: int = self._server.sockets[0].getsockname()[1]

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def _soon(self, fn: Any, *args: Any) -> None:
        async def run() -> None:
            fn(*args)
        self._call(run())

    def url(self, url: str) -> str:
        """`url` through the proxy (its host and port replaced)."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@{self.host}:{self.port}" if user else f"{self.host}:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    async def _accept(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(writer)
        self.links.add(link)
        if self.hang_new:
            self.hung.add(link)  # accepted, never answered
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.to_port)
        except OSError:
            link.close(reset=True)
            self.links.discard(link)
            return
        link.server = up_writer
        link.pumps = [asyncio.ensure_future(self._pump(reader, up_writer, link)),
                      asyncio.ensure_future(self._pump(up_reader, writer, link))]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    link: _Link) -> None:
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        # One side closed: close both, unless the link was made to hang meanwhile.
        if link not in self.hung:
            link.close()
            self.links.discard(link)

    def hang(self, new: bool = False) -> None:
        """The connections open now stop forwarding (they stay open); with `new`, the
        connections made from now on are accepted and never answered too."""
        def run() -> None:
            self.hang_new = self.hang_new or new
            for link in list(self.links):
                self.hung.add(link)
                link.stop()
        self._soon(run)

    def forward(self, to_port: int | None = None) -> None:
        """New connections are forwarded again (to `to_port`, if given); hung ones stay
        hung."""
        def run() -> None:
            if to_port is not None:
                self.to_port = to_port
            self.hang_new = False
        self._soon(run)

    def reset(self) -> None:
        """Resets every connection open now (RST to both sides)."""
        def run() -> None:
            for link in list(self.links):
                link.close(reset=True)
            self.links.clear()
            self.hung.clear()
        self._soon(run)

    def close(self) -> None:
        """Stops listening and closes every connection."""
        async def run() -> None:
            self._server.close()
            for link in list(self.links):
                link.close(reset=True)
            self.links.clear()
        self._call(run())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
