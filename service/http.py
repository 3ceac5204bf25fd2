"""The outbound HTTP client of the handshake and of deliveries.

httpx's API over aiohttp's transport (httpx-aiohttp): httpx's own transport posts several
times slower on this kind of workload. Redirects are never followed, and every connection
passes the SSRF guard, both for host names (GuardedResolver) and for IP literals.
"""

from __future__ import annotations

import ipaddress
import socket

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from service import __version__
from service.ssrf import GuardedResolver, TargetRejected, check_address

USER_AGENT = f"pg-webhooks/{__version__}"


class GuardedTransport(httpx.AsyncBaseTransport):
    """Refuses requests to forbidden IP literals before handing them to aiohttp."""

    def __init__(self, inner: httpx.AsyncBaseTransport, allow_private: bool) -> None:
        self._inner = inner
        self._allow_private = allow_private

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol("only http and https targets are allowed",
                                            request=request)
        host = request.url.host
        if not self._allow_private:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                pass  # a name: GuardedResolver checks what it resolves to
            else:
                try:
                    check_address(host, host)
                except TargetRejected as exc:
                    raise httpx.ConnectError(str(exc), request=request) from None
        try:
            return await self._inner.handle_async_request(request)
        except httpx.ConnectTimeout as exc:
            raise _remap(exc, request) from exc.__cause__

    async def aclose(self) -> None:
        await self._inner.aclose()


def _remap(exc: httpx.ConnectTimeout, request: httpx.Request) -> httpx.TransportError:
    """The right httpx error for an aiohttp connection error.

    httpx-aiohttp maps every aiohttp.ClientConnectionError (refused, unresolvable, refused
    by the guard, server disconnected) to ConnectTimeout; callers need to tell a timeout
    from a refusal, so the original error decides.
    """
    cause = exc.__cause__
    if cause is None or isinstance(cause, TimeoutError):
        return exc
    if isinstance(cause, aiohttp.ClientConnectorError):
        # Certificate errors carry no os_error.
        os_error = getattr(cause, "os_error", None)
        if isinstance(cause, aiohttp.ClientConnectorCertificateError):
            message = f"TLS certificate of {cause.host} is not valid: {cause.certificate_error}"
        elif isinstance(os_error, ConnectionRefusedError):
            message = f"connection refused by {cause.host}:{cause.port}"
        elif isinstance(os_error, PermissionError) and os_error.strerror:
            message = os_error.strerror  # the SSRF guard's reason
        elif isinstance(os_error, socket.gaierror):
            message = f"host {cause.host} does not resolve"
        else:
            reason = getattr(os_error, "strerror", None) or os_error or cause
            message = f"cannot connect to {cause.host}:{cause.port}: {reason}"
        return httpx.ConnectError(message, request=request)
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError("server closed the connection without a response",
                                         request=request)
    return httpx.ConnectError(str(cause) or type(cause).__name__, request=request)


def make_client(*, allow_private: bool, timeout: float, max_connections: int = 100,
                per_host: int = 0) -> httpx.AsyncClient:
    """An httpx client that never follows redirects and only connects to allowed addresses.

    Create it inside the event loop that will use it, and close it with `aclose()`.
    """
    connector = aiohttp.TCPConnector(
        resolver=GuardedResolver(allow_private),
        limit=max_connections,
        limit_per_host=per_host,
        ttl_dns_cache=10,
    )
    session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                    trust_env=False)
    transport = GuardedTransport(AiohttpTransport(client=session, trust_env=False),
                                 allow_private)
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        headers={"User-Agent": USER_AGENT},
        trust_env=False,
    )


async def read_limited(response: httpx.Response, limit: int) -> bytes:
    """At most `limit` bytes of a streamed response body; the rest is never read."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]
