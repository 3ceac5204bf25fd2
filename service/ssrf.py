"""The SSRF guard: which target URLs and addresses the service may send requests to.

Used when a subscription is created (a clear 400 before any connection) and again by the
HTTP client at every connection (`GuardedResolver`), so a host whose DNS answer changes
after the handshake still cannot reach a private address.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from urllib.parse import SplitResult, urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_LENGTH = 2048

# Ranges that `is_private` and friends do not all cover on every Python version.
_EXTRA_BLOCKED: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = (
    (ipaddress.ip_network("100.64.0.0/10"), "shared (CGNAT)"),
    (ipaddress.ip_network("192.0.0.0/24"), "IETF protocol assignment"),
    (ipaddress.ip_network("198.18.0.0/15"), "benchmarking"),
    (ipaddress.ip_network("64:ff9b:1::/48"), "local-use NAT64"),
    (ipaddress.ip_network("2002::/16"), "6to4"),
    (ipaddress.ip_network("fec0::/10"), "site-local"),
)


class TargetRejected(ValueError):
    """The target may not be used; the message says why, in words an integrator can act on."""


def check_url(url: str, max_length: int = MAX_URL_LENGTH) -> SplitResult:
    """The parsed URL if it is an absolute http(s) URL with a host and no user-info."""
    if len(url) > max_length:
        raise TargetRejected(f"target URL is longer than {max_length} characters")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise TargetRejected("target URL must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRejected(f"target is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise TargetRejected("target must be an http:// or https:// URL")
    if not parts.hostname:
        raise TargetRejected("target URL has no host")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise TargetRejected("target URL must not contain user name or password")
    if port == 0:
        raise TargetRejected("target URL has port 0")
    return parts


def _unwrap(ip: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv4-mapped, IPv4-compatible-translated or NAT64 IPv6 one."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in ipaddress.ip_network("64:ff9b::/96"):
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def forbidden_reason(ip: IPAddress) -> str | None:
    """Why a target may not be at this address (loopback, private, ...), or None if it may."""
    ip = _unwrap(ip)
    checks = (
        (ip.is_loopback, "loopback"),
        (ip.is_unspecified, "unspecified"),
        (ip.is_link_local, "link-local"),
        (ip.is_multicast, "multicast"),
        (ip.is_private, "private"),
        (ip.is_reserved, "reserved"),
        (not ip.is_global, "non-public"),
    )
    for hit, reason in checks:
        if hit:
            return reason
    for network, reason in _EXTRA_BLOCKED:
        if ip.version == network.version and ip in network:
            return reason
    return None


def check_address(host: str, address: str) -> None:
    """Raises TargetRejected if `address` (which `host` resolved to) is not public."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        raise TargetRejected(f"target host {host} resolved to an invalid address") from None
    reason = forbidden_reason(ip)
    if reason is not None:
        shown = host if host == address else f"{host} resolves to {address}, which"
        raise TargetRejected(f"target {shown} is a {reason} address; only public addresses "
                             "are allowed (WEBHOOKS_ALLOW_PRIVATE_TARGETS)")


async def resolve_checked(host: str, port: int, allow_private: bool) -> list[str]:
    """Every address `host` resolves to; raises TargetRejected if any is not allowed."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TargetRejected(f"target host {host} does not resolve: {exc.strerror}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise TargetRejected(f"target host {host} does not resolve")
    if not allow_private:
        for address in addresses:
            check_address(host, address)
    return addresses


async def check_target(url: str, allow_private: bool, max_length: int = MAX_URL_LENGTH) -> None:
    """Raises TargetRejected unless `url` is a well-formed target whose host is allowed."""
    parts = check_url(url, max_length)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    await resolve_checked(parts.hostname or "", port, allow_private)


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that refuses, at connection time, hosts with a forbidden address.

    Every address of the answer is checked, not only the one connected to, so a DNS answer
    that mixes public and private addresses is refused whole.
    """

    def __init__(self, allow_private: bool) -> None:
        self._allow_private = allow_private
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        if not self._allow_private:
            for result in results:
                try:
                    check_address(host, str(result["host"]))
                except TargetRejected as exc:
                    # aiohttp reports OSError from a resolver as a connection error.
                    raise OSError(errno.EACCES, str(exc)) from None
        return results

    async def close(self) -> None:
        await self._inner.close()

