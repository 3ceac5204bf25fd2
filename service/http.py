"""The outbound HTTP client of the handshake, and what every outbound request shares.

The handshake uses httpx's API over aiohttp's transport (httpx-aiohttp); measured on 2
cores, httpx's own transport posts 5 to 20 times slower than aiohttp (see
bench/README.md). The worker's deliveries go through libcurl instead (service/curl/),
which costs about two thirds of aiohttp's CPU per POST. Either way redirects are never
followed and every connection passes the SSRF guard, for host names (GuardedResolver, at
connection time) and for IP literals (check_literal).
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import socket
import ssl
import tempfile
from collections.abc import Sequence
from http.cookiejar import Cookie, CookieJar
from pathlib import Path

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from service import __version__
from service.ssrf import DNS_TIMEOUT, GuardedResolver, TargetRejected, check_address

USER_AGENT = f"pg-webhooks/{__version__}"
# Answers are never decompressed, so none are asked for compressed: a compressed error
# page would only be stored as bytes, and a small compressed body can inflate hugely.
HEADERS = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}


class NoCookies(CookieJar):
    """A cookie jar that never keeps a cookie: one target (or owner) cannot set state that
    the service would send to it, or to another, later."""

    def set_cookie(self, cookie: Cookie) -> None:
        return None

    def extract_cookies(self, response: object, request: object) -> None:
        return None


def check_literal(host: str | None, allow_private: bool) -> None:
    """Raises TargetRejected if `host` is an IP literal that is not allowed.

    aiohttp does not call the resolver for IP literals, so they are checked here.
    """
    if allow_private or not host:
        return
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return  # a name: GuardedResolver checks what it resolves to
    check_address(host, host.strip("[]"))


class _Connector(aiohttp.TCPConnector):
    """A TCPConnector that closes the resolver it was given (aiohttp closes only its own),
    so no name lookup outlives the session."""

    async def close(self, *, abort_ssl: bool = False) -> None:
        await super().close(abort_ssl=abort_ssl)
        if not self._resolver_owner:
            await self._resolver.close()


def _system_ca_file() -> str | None:
    """The system's CA bundle (as Python's ssl module finds it), or None for libcurl's."""
    paths = ssl.get_default_verify_paths()
    for path in (paths.cafile, paths.openssl_cafile):
        if path and os.path.isfile(path):
            return path
    return None


def _ca_with(extra: str) -> str:
    """A file of the system's CA certificates and those of `extra` (WEBHOOKS_CA_BUNDLE),
    made once per process (libcurl takes one file; its parsed store is cached and shared
    by the client's transfers)."""
    made = _CA_FILES.get(extra)
    if made is not None and os.path.isfile(made):
        return made
    system = _system_ca_file()
    parts = [Path(system).read_bytes() if system else b"", Path(extra).read_bytes()]
    fd, made = tempfile.mkstemp(prefix="webhooks-ca-", suffix=".pem")
    with os.fdopen(fd, "wb") as f:
        f.write(b"\n".join(parts))
    atexit.register(_remove, made)
    _CA_FILES[extra] = made
    return made


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


_CA_FILES: dict[str, str] = {}


def ca_file(ca_bundle: str | None) -> str | None:
    """The CA file libcurl verifies targets' certificates with: the system's, with those
    of `ca_bundle` (WEBHOOKS_CA_BUNDLE) added; None: libcurl's own default."""
    return _system_ca_file() if ca_bundle is None else _ca_with(ca_bundle)


def tls_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """Certificates verified against the system's CAs and those of `ca_bundle`
    (WEBHOOKS_CA_BUNDLE), host names checked."""
    context = ssl.create_default_context()
    if ca_bundle is not None:
        context.load_verify_locations(cafile=ca_bundle)
    return context


def make_session(*, allow_private: bool, max_connections: int = 100, per_host: int = 0,
                 dns_timeout: float = DNS_TIMEOUT, dns_servers: Sequence[str] = (),
                 ca_bundle: str | None = None) -> aiohttp.ClientSession:
    """An aiohttp session: guarded asynchronous resolution (each lookup bounded by
    `dns_timeout`), no cookies kept, no compression asked for and none undone, certificates
    verified (against the system's CAs and `ca_bundle`'s). A request takes at most 300
    seconds unless the caller bounds it sooner, its connection at most 30.

    Create it inside the event loop that will use it, and close it with `close()`.
    """
    connector = _Connector(
        resolver=GuardedResolver(allow_private, timeout=dns_timeout, nameservers=dns_servers),
        limit=max_connections,
        limit_per_host=per_host,
        ttl_dns_cache=10,
        ssl=tls_context(ca_bundle) if ca_bundle else True,  # True: aiohttp's, verifying
    )
    return aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False,
                                 cookie_jar=aiohttp.DummyCookieJar(), headers=HEADERS,
                                 timeout=aiohttp.ClientTimeout(total=300.0, sock_connect=30.0))


class GuardedTransport(httpx.AsyncBaseTransport):
    """Refuses requests to forbidden IP literals before handing them to aiohttp."""

    def __init__(self, inner: httpx.AsyncBaseTransport, allow_private: bool) -> None:
        self._inner = inner
        self._allow_private = allow_private

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol("only http and https targets are allowed",
                                            request=request)
        try:
            check_literal(request.url.host, self._allow_private)
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
        elif isinstance(cause, aiohttp.ClientConnectorDNSError):
            reason = getattr(os_error, "strerror", None) or "no address"
            message = f"host {cause.host} does not resolve: {reason}"
        else:
            reason = getattr(os_error, "strerror", None) or os_error or cause
            message = f"cannot connect to {cause.host}:{cause.port}: {reason}"
        return httpx.ConnectError(message, request=request)
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError("server closed the connection without a response",
                                         request=request)
    return httpx.ConnectError(str(cause) or type(cause).__name__, request=request)


def make_client(*, allow_private: bool, timeout: float, max_connections: int = 100,
                per_host: int = 0, dns_timeout: float | None = None,
                dns_servers: Sequence[str] = (), ca_bundle: str | None = None
                ) -> httpx.AsyncClient:
    """An httpx client that never follows redirects, only connects to allowed addresses,
    keeps no cookies (one handshake never carries what another target or owner set) and
    asks for no compression. Name lookups take at most `dns_timeout` seconds (default:
    the smaller of DNS_TIMEOUT and `timeout`).

    Create it inside the event loop that will use it, and close it with `aclose()`.
    """
    session = make_session(allow_private=allow_private, max_connections=max_connections,
                           per_host=per_host,
                           dns_timeout=dns_timeout or min(DNS_TIMEOUT, timeout),
                           dns_servers=dns_servers, ca_bundle=ca_bundle)
    transport = GuardedTransport(AiohttpTransport(client=session, trust_env=False),
                                 allow_private)
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        headers=HEADERS,
        cookies=NoCookies(),
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
