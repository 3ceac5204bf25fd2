"""An HTTP CONNECT proxy on 127.0.0.1 for the tests of WEBHOOKS_DELIVERY_PROXY: it records
what it is asked, may demand credentials or refuse, and tunnels the bytes of what it
accepts. (tests/support/proxy.py is the database's TCP proxy that hangs or resets.)"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass, field


@dataclass
class Asked:
    """One request the proxy got: its request line and its Proxy-Authorization."""

    method: str
    target: str
    authorization: str | None


@dataclass
class ConnectProxy:
    """`credentials` ("user:password"): anything without them is answered 407.
    `refuse`: a status every CONNECT is answered with instead of a tunnel."""

    credentials: str | None = None
    refuse: int | None = None
    asked: list[Asked] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        user = f"{self.credentials}@" if self.credentials else ""
        return f"http://{user}127.0.0.1:{self.port}"

    async def __aenter__(self) -> ConnectProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await self._server.wait_closed()

    def tunnels(self) -> list[str]:
        """The host:port of every CONNECT accepted or not."""
        return [a.target for a in self.asked if a.method == "CONNECT"]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = [*lines[0].split(" "), "", ""][:3]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        self.asked.append(Asked(method, target, headers.get("proxy-authorization")))
        wanted = None if self.credentials is None else \
            "Basic " + base64.b64encode(self.credentials.encode()).decode()
        if method != "CONNECT":
            await self._answer(writer, 405, "Method Not Allowed")
        elif wanted is not None and headers.get("proxy-authorization") != wanted:
            await self._answer(writer, 407, "Proxy Authentication Required",
                               'Proxy-Authenticate: Basic realm="tests"\r\n')
        elif self.refuse is not None:
            await self._answer(writer, self.refuse, "Refused")
        else:
            host, _, port = target.rpartition(":")
            try:
                up_reader, up_writer = await asyncio.open_connection(host.strip("[]"),
                                                                     int(port))
            except (OSError, ValueError):
                await self._answer(writer, 502, "Bad Gateway")
                return
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _answer(self, writer: asyncio.StreamWriter, status: int, reason: str,
                      extra: str = "") -> None:
        writer.write(f"HTTP/1.1 {status} {reason}\r\n{extra}Content-Length: 0\r\n"
                     "Connection: close\r\n\r\n".encode())
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
