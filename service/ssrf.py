"""The SSRF guard: which target URLs and addresses the service may send requests to.

Used when a subscription is created (a clear 400 before any connection) and again by the
HTTP client at every connection (`GuardedResolver`), so a host whose DNS answer changes
after the handshake still cannot reach a private address.

Names are resolved asynchronously by c-ares (aiodns, through aiohttp's AsyncResolver),
each lookup bounded by its own timeout: a target's hanging name server costs that
target's lookups their timeout and nothing else (getaddrinfo would hold one of a few
threads each, and stall everyone's lookups). Refusals say what kind of address a host
resolves to, never the address: an integrator must not learn internal DNS from them.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from collections.abc import Sequence
from functools import lru_cache
from urllib.parse import SplitResult, urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import AsyncResolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_LENGTH = 2048
# Longest wait for one name lookup, in seconds (WEBHOOKS_DNS_TIMEOUT).
DNS_TIMEOUT = 5.0

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


def _a(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def check_address(host: str, address: str) -> None:
    """Raises TargetRejected if `address` (which `host` resolved to) is not public.

    The message names the host and the kind of address, not the address itself.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        raise TargetRejected(f"target host {host} resolved to an invalid address") from None
    reason = forbidden_reason(ip)
    if reason is not None:
        what = f"target {host} is" if is_literal(host) else f"target host {host} resolves to"
        raise TargetRejected(f"{what} {_a(reason)} address; only public addresses are "
                             "allowed (WEBHOOKS_ALLOW_PRIVATE_TARGETS)")


@lru_cache(maxsize=4096)
def is_literal(host: str) -> bool:
    """Whether `host` is an IP address written as such (in any form getaddrinfo reads).
    Cached: the worker asks it before every POST, and the parse costs 10-20 µs."""
    return _numeric(host.strip("[]"), 0, socket.AF_UNSPEC) is not None


def _numeric(host: str, port: int, family: int) -> list[ResolveResult] | None:
    """The address of an IP literal (dotted, IPv6, and the legacy forms such as 127.1 or
    0x7f000001 that some URL parsers let through), or None for a name. No lookup happens:
    AI_NUMERICHOST only parses."""
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0,
                                   socket.AI_NUMERICHOST | socket.AI_NUMERICSERV)
    except (OSError, UnicodeError, ValueError):
        return None
    return [ResolveResult(hostname=host, host=str(info[4][0]), port=int(info[4][1]),
                          family=info[0], proto=info[2],
                          flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV)
            for info in infos]


async def resolve_checked(host: str, port: int, allow_private: bool, *,
                          timeout: float = DNS_TIMEOUT,
                          nameservers: Sequence[str] | None = None) -> list[str]:
    """Every address `host` resolves to; raises TargetRejected if any is not allowed, or
    if the name does not resolve within `timeout` seconds."""
    resolver = GuardedResolver(True, timeout=timeout, nameservers=nameservers)
    try:
        results = await resolver.resolve(host, port, socket.AF_UNSPEC)
    except OSError as exc:
        reason = exc.strerror or str(exc) or "no address"
        raise TargetRejected(f"target host {host} does not resolve: {reason}") from None
    finally:
        await resolver.close()
    addresses = list(dict.fromkeys(str(r["host"]) for r in results))
    if not addresses:
        raise TargetRejected(f"target host {host} does not resolve")
    if not allow_private:
        for address in addresses:
            check_address(host, address)
    return addresses


async def check_target(url: str, allow_private: bool, max_length: int = MAX_URL_LENGTH, *,
                       timeout: float = DNS_TIMEOUT,
                       nameservers: Sequence[str] | None = None) -> None:
    """Raises TargetRejected unless `url` is a well-formed target whose host is allowed."""
    parts = check_url(url, max_length)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    await resolve_checked(parts.hostname or "", port, allow_private, timeout=timeout,
                          nameservers=nameservers)


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that refuses, at connection time, hosts with a forbidden address.

    Every address of the answer is checked, not only the one connected to, so a DNS answer
    that mixes public and private addresses is refused whole. IP literals are parsed, not
    looked up; names go to c-ares (the system's name servers and hosts file, or
    `nameservers`, each "ip" or "ip:port"), and a lookup that takes longer than `timeout`
    seconds fails with an OSError, which aiohttp reports as a connection error.
    """

    def __init__(self, allow_private: bool, *, timeout: float = DNS_TIMEOUT,
                 nameservers: Sequence[str] | None = None) -> None:
        self._allow_private = allow_private
        self._timeout = timeout
        self._nameservers = list(nameservers or ())
        self._inner: AsyncResolver | None = None

    def _resolver(self) -> AsyncResolver:
        if self._inner is None:
            # c-ares' own bound, so an abandoned query does not linger: two tries, each
            # about half the overall timeout (asyncio.timeout below is the hard bound).
            per_try = max(0.05, self._timeout / 2)
            if self._nameservers:
                self._inner = AsyncResolver(nameservers=self._nameservers, timeout=per_try,
                                            tries=2)
            else:
                self._inner = AsyncResolver(timeout=per_try, tries=2)
        return self._inner

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = _numeric(host, port, family)
        if results is None:
            try:
                async with asyncio.timeout(self._timeout):
                    results = await self._resolver().resolve(host, port, family)
            except TimeoutError:
                raise OSError(errno.ETIMEDOUT, f"DNS lookup of {host} got no answer within "
                              f"{self._timeout:g}s") from None
        if not self._allow_private:
            for result in results:
                try:
                    check_address(host, str(result["host"]))
                except TargetRejected as exc:
                    # aiohttp reports OSError from a resolver as a connection error.
                    raise OSError(errno.EACCES, str(exc)) from None
        return results

    async def close(self) -> None:
        if self._inner is not None:
            inner, self._inner = self._inner, None
            await inner.close()
