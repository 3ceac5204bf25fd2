"""The worker's HTTP client: libcurl's multi interface (pycurl) driven by the asyncio loop.

Measured on 2 cores against the same receiver, a POST costs the process about 45 µs of CPU
through this client and 70 µs through aiohttp (bench/FINDINGS.md), most of the worker's
CPU per delivery. What the worker promises about hostile targets holds here too:

- Names are resolved by GuardedResolver (c-ares, WEBHOOKS_DNS_SERVERS and
  WEBHOOKS_DNS_TIMEOUT, every address of the answer checked) and handed to libcurl
  (CURLOPT_RESOLVE), so libcurl never looks a name up itself; and every socket it opens
  is checked again, address by address, before it exists (CURLOPT_OPENSOCKETFUNCTION).
- Only http and https, no proxy from the environment, no redirects followed, no cookies
  kept, no compression asked for or undone, HTTP/1.1 only.
- With a delivery proxy (WEBHOOKS_DELIVERY_PROXY), every transfer goes through it by
  CONNECT, for http and https alike, to the address the guard checked (CURLOPT_CONNECT_TO:
  the proxy's own name lookup is never used); the host name still goes in Host and TLS
  SNI. The proxy's own address is the operator's: the socket to it is not checked.
- Of an answer, the status line, at most MAX_HEADER_BYTES of headers (more ends the
  attempt) and the first BODY_LIMIT bytes of the body are read; the rest is not.

The loop drives libcurl through its socket and timer callbacks (multi.py): libcurl says
which sockets to watch and when its next timeout is due; the loop calls it back then. On
Linux the sockets are watched through one epoll object of the client's own (the loop
watches that), and each easy handle keeps its callbacks (transfer.py) and unchanged
options (options.py) between POSTs: together about a quarter less of the client's CPU per
POST than with each socket on the loop and every option set again.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Sequence

import pycurl

from service.curl.multi import MultiDriver
from service.curl.options import BASE_HEADERS, DNS_TTL, connect_to, easy_handle
from service.curl.transfer import AttemptError, Handle, Transfer
from service.http import ca_file
from service.ssrf import DNS_TIMEOUT, GuardedResolver, TargetRejected, is_literal

# AttemptError is what post() raises when no usable answer came: its callers catch it.
__all__ = ["AttemptError", "CurlClient"]


class CurlClient(MultiDriver):
    """POSTs through one libcurl multi handle, on the running loop; close() when done."""

    def __init__(self, *, allow_private: bool, max_connections: int = 100,
                 dns_timeout: float = DNS_TIMEOUT, dns_servers: Sequence[str] = (),
                 connect_timeout: float = 30.0, body_limit: int = 1024,
                 watch_with_epoll: bool = True, ca_bundle: str | None = None,
                 proxy: str | None = None) -> None:
        super().__init__(max_connections=max_connections, watch_with_epoll=watch_with_epoll,
                         proxy=proxy)
        self._allow_private = allow_private
        self.allow_private = allow_private  # the targets' rule, whatever the proxy's
        self._resolver = GuardedResolver(allow_private, timeout=dns_timeout,
                                         nameservers=dns_servers)
        self._connect_ms = max(1, int(connect_timeout * 1000))
        self._body_limit = body_limit
        self._ca = ca_file(ca_bundle)
        # TLS sessions shared by every transfer: a new connection to a host resumes the
        # session of the last one (an abbreviated handshake); open connections are kept
        # and reused per host by the multi handle (keep-alive).
        self._share = pycurl.CurlShare()
        self._share.setopt(pycurl.SH_SHARE, pycurl.LOCK_DATA_SSL_SESSION)
        self._names: dict[tuple[str, int], tuple[float, str]] = {}
        self._free: list[Handle] = []

    async def post(self, url: str, host: str, port: int, body: bytes,
                   headers: Sequence[str], timeout: float,
                   keep_headers: list[bytes] | None = None) -> tuple[int, str | None, bytes]:
        """One POST of `body` to `url` (whose host and port are given, already checked if an
        IP literal), within `timeout` seconds: (status, Retry-After, the first body bytes).

        Raises TargetRejected when the host may not be reached, AttemptError when no usable
        answer came (the name does not resolve, the connection fails, the answer is not
        HTTP), TimeoutError when none came in time."""
        resolve = await self._resolve(host, port)
        handle = self._free.pop() if self._free else self._new_handle()
        transfer = Transfer(self._loop.create_future(), host, port, self._body_limit)
        transfer.headers = keep_headers
        curl = handle.curl
        if handle.url != url:
            curl.setopt(pycurl.URL, url)
            handle.url = url
        if self._proxy is None:
            # Given with every request: libcurl loads it into its DNS cache when the
            # transfer starts, so it never looks the name up itself.
            curl.setopt(pycurl.RESOLVE, resolve)
        else:
            # Through the proxy: CONNECT to the first checked address, never to the name.
            curl.setopt(pycurl.CONNECT_TO, connect_to(host, port, resolve))
        curl.setopt(pycurl.HTTPHEADER, [*BASE_HEADERS, *headers])
        curl.setopt(pycurl.POSTFIELDS, body)
        timeout_ms = max(1, int(timeout * 1000))
        if handle.timeout_ms != timeout_ms:
            curl.setopt(pycurl.TIMEOUT_MS, timeout_ms)
            handle.timeout_ms = timeout_ms
        handle.transfer = transfer
        self._busy[curl] = handle
        self._multi.add_handle(curl)
        try:
            if self._timer is not None and self._timer_at == 0.0 and len(self._busy) == 1:
                # libcurl asked (inside add_handle) to be called at once. The only
                # transfer (a lone change's POST): done here, so the request is on its way
                # before the loop runs whatever else is ready. Many at once (a burst) are
                # started together by the loop's one call.
                self._timer.cancel()
                self._timer = None
                self._act(pycurl.SOCKET_TIMEOUT, 0)
            status = await transfer.future
        finally:
            if self._busy.pop(curl, None) is not None:
                self._multi.remove_handle(curl)  # cancelled: the transfer stops here
            handle.transfer = None  # the callbacks act on nothing until the next one
            if not self._closed:
                self._free.append(handle)
            else:
                curl.close()
        return status, transfer.retry_after, bytes(transfer.body)

    async def exchange(self, url: str, host: str, port: int, body: bytes,
                       headers: Sequence[str], timeout: float
                       ) -> tuple[int, list[tuple[str, str]], bytes]:
        """As post(), for the verification handshake: (status, the answer's headers as
        (lowercase name, value) pairs, the first body bytes)."""
        kept: list[bytes] = []
        status, _, answer = await self.post(url, host, port, body, headers, timeout,
                                            keep_headers=kept)
        pairs = []
        for line in kept:
            name, colon, value = line.decode("latin-1").partition(":")
            if colon:
                pairs.append((name.strip().lower(), value.strip()))
        return status, pairs, answer

    async def close(self) -> None:
        """Ends every transfer and connection; the client cannot be used after."""
        self._close_multi()
        for handle in self._free:
            handle.curl.close()
        self._free.clear()
        self._unwatch()
        self._share.close()
        await self._resolver.close()

    def _new_handle(self) -> Handle:
        curl = easy_handle(connect_ms=self._connect_ms, ca=self._ca, share=self._share,
                           proxy=self._proxy)
        # Every socket goes to the proxy when there is one: the operator's address.
        return Handle(curl, self._allow_private or self._proxy is not None)

    async def _resolve(self, host: str, port: int) -> list[str]:
        """The CURLOPT_RESOLVE entry that pins `host:port` to its checked addresses (none for
        an IP literal), from a cache of DNS_TTL seconds."""
        if is_literal(host):
            return []
        now = time.monotonic()
        cached = self._names.get((host, port))
        if cached is not None and cached[0] > now:
            return [cached[1]]
        try:
            results = await self._resolver.resolve(host, port, socket.AF_UNSPEC)
        except OSError as exc:
            if exc.errno == errno.EACCES and exc.strerror:  # the guard's refusal
                raise TargetRejected(exc.strerror) from None
            if exc.errno == errno.ETIMEDOUT and exc.strerror:  # the lookup's own bound
                raise AttemptError(exc.strerror) from None
            reason = exc.strerror or str(exc) or "no address"
            raise AttemptError(f"host {host} does not resolve: {reason}") from None
        addresses = list(dict.fromkeys(str(r["host"]) for r in results))
        if not addresses:
            raise AttemptError(f"host {host} does not resolve")
        # "+": libcurl may drop the entry after its own DNS cache timeout; CURLOPT_RESOLVE
        # is given again with every request anyway.
        pinned = ",".join(f"[{a}]" if ":" in a else a for a in addresses)
        entry = f"+{host}:{port}:{pinned}"
        if len(self._names) > 4096:
            self._names.clear()
        self._names[(host, port)] = (now + DNS_TTL, entry)
        return [entry]
