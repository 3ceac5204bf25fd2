"""The worker's HTTP client: libcurl's multi interface (pycurl) driven by the asyncio loop.

Measured on 2 cores against the same receiver, a POST costs the process about 45 µs of CPU
through this client and 70 µs through aiohttp (bench/HISTORY.md), most of the worker's
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

The loop drives libcurl through its socket and timer callbacks: libcurl says which
sockets to watch and when its next timeout is due; the loop calls it back then. On Linux
the sockets are watched through one epoll object of the client's own (the loop watches
that), and each easy handle keeps its callbacks and unchanged options between POSTs:
together about a quarter less of the client's CPU per POST than with each socket on the
loop and every option set again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import select
import socket
import time
from collections.abc import Sequence
from typing import Any

import pycurl

from service.http import USER_AGENT, ca_file
from service.ssrf import DNS_TIMEOUT, GuardedResolver, TargetRejected, check_address, is_literal

# Sent with every POST: no compressed answer is asked for (it would only be stored as
# bytes, and a small compressed body can inflate hugely), and no 100-continue round trip.
BASE_HEADERS = (f"User-Agent: {USER_AGENT}", "Accept-Encoding: identity", "Expect:")

# The most response-header bytes read; a target that sends more fails the attempt.
MAX_HEADER_BYTES = 64 * 1024
# How long a name's addresses are reused before it is looked up again, in seconds.
DNS_TTL = 10.0

# libcurl errors after which the answer that came (status and headers) still counts: the
# body was cut short, by the target or by us once BODY_LIMIT bytes were read.
_BODY_ERRORS = frozenset({pycurl.E_WRITE_ERROR, pycurl.E_PARTIAL_FILE, pycurl.E_RECV_ERROR,
                          pycurl.E_GOT_NOTHING})


class AttemptError(Exception):
    """An attempt that got no usable answer: the message says why, for the record."""


class _Transfer:
    """One POST under way: what its callbacks collected."""

    __slots__ = ("body", "future", "header_bytes", "headers", "host", "limit", "refused",
                 "retry_after", "too_large", "where")

    def __init__(self, future: asyncio.Future[int], host: str, port: int, limit: int) -> None:
        self.future = future
        self.host = host
        self.where = f"{host}:{port}"
        self.limit = limit
        self.body = bytearray()
        self.header_bytes = 0
        self.retry_after: str | None = None
        self.refused: str | None = None  # why a socket was refused
        self.too_large = False
        self.headers: list[bytes] | None = None  # every header line, when asked for

    def header(self, line: bytes) -> int | None:
        self.header_bytes += len(line)
        if self.header_bytes > MAX_HEADER_BYTES:
            self.too_large = True
            return -1  # any other count than len(line): ends the transfer
        if line[:12].lower() == b"retry-after:":
            self.retry_after = line[12:].strip().decode("latin-1")
        elif line.startswith(b"HTTP/"):
            # A new answer (after a 1xx): its own headers only.
            self.retry_after = None
            if self.headers is not None:
                self.headers.clear()
        if self.headers is not None:
            self.headers.append(line)
        return None

    def write(self, data: bytes) -> int | None:
        room = self.limit - len(self.body)
        if room > 0:
            self.body += data[:room]
        # Enough read: 0 ends the transfer (and closes its connection).
        return 0 if len(self.body) >= self.limit else None


class _Handle:
    """A libcurl easy handle, its callbacks (set once: they act on whatever transfer the
    handle carries) and the options it was last given, which stay set between transfers
    and are only given again when they change."""

    __slots__ = ("allow_private", "curl", "timeout_ms", "transfer", "url")

    def __init__(self, curl: pycurl.Curl, allow_private: bool) -> None:
        self.curl = curl
        self.allow_private = allow_private
        self.transfer: _Transfer | None = None
        self.url: str | None = None
        self.timeout_ms = -1
        curl.setopt(pycurl.HEADERFUNCTION, self.header)
        curl.setopt(pycurl.WRITEFUNCTION, self.write)
        curl.setopt(pycurl.OPENSOCKETFUNCTION, self.open_socket)

    def header(self, line: bytes) -> int | None:
        transfer = self.transfer
        return None if transfer is None else transfer.header(line)

    def write(self, data: bytes) -> int | None:
        transfer = self.transfer
        return None if transfer is None else transfer.write(data)

    def open_socket(self, purpose: int, address: tuple[int, int, int, tuple[Any, ...]]
                    ) -> socket.socket | None:
        transfer = self.transfer
        if transfer is None:
            return None  # CURL_SOCKET_BAD: no transfer asked for it
        family, socktype, protocol, addr = address
        if not self.allow_private:
            try:
                check_address(transfer.host, str(addr[0]))
            except TargetRejected as exc:
                transfer.refused = str(exc)
                return None  # this address is not connected to
        return socket.socket(family, socktype, protocol)


class _Epoll:
    """libcurl's sockets watched through one epoll object, which the loop watches: a
    socket libcurl starts or stops watching costs one epoll_ctl here, where the loop's
    add_reader and remove_reader cost a Python handle and selector key each (a tenth of
    the worker's CPU per delivery). Linux only; elsewhere the loop watches each socket."""

    def __init__(self, loop: asyncio.AbstractEventLoop, action: Any, done: Any) -> None:
        self._loop = loop
        self._action = action
        self._done = done
        self._epoll = select.epoll()
        self._masks: dict[int, int] = {}
        loop.add_reader(self._epoll.fileno(), self._ready)

    def on_socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        """libcurl's socket callback (CURLMOPT_SOCKETFUNCTION)."""
        epoll = self._epoll
        if epoll.closed:  # the client is closing: libcurl shuts its connections down
            return
        if what == pycurl.POLL_REMOVE:
            if self._masks.pop(fd, None) is not None:
                with contextlib.suppress(OSError):  # already closed: out of the set
                    epoll.unregister(fd)
            return
        mask = ((select.EPOLLIN if what & pycurl.POLL_IN else 0)
                | (select.EPOLLOUT if what & pycurl.POLL_OUT else 0))
        old = self._masks.get(fd)
        if old == mask:
            return
        self._masks[fd] = mask
        try:
            if old is None:
                epoll.register(fd, mask)
            else:
                epoll.modify(fd, mask)
        except FileExistsError:  # a number reused before libcurl said it was gone
            epoll.modify(fd, mask)
        except FileNotFoundError:  # closed and reused: the set forgot it
            epoll.register(fd, mask)

    def _ready(self) -> None:
        ready = self._epoll.poll(0)
        for fd, events in ready:
            flags = 0
            if events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                flags |= pycurl.CSELECT_IN
            if events & (select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR):
                flags |= pycurl.CSELECT_OUT
            if events & select.EPOLLERR:
                flags |= pycurl.CSELECT_ERR
            self._action(fd, flags)
        if ready:
            self._done()

    def close(self) -> None:
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
        self._masks.clear()


class CurlClient:
    """POSTs through one libcurl multi handle, on the running loop; close() when done."""

    def __init__(self, *, allow_private: bool, max_connections: int = 100,
                 dns_timeout: float = DNS_TIMEOUT, dns_servers: Sequence[str] = (),
                 connect_timeout: float = 30.0, body_limit: int = 1024,
                 watch_with_epoll: bool = True, ca_bundle: str | None = None,
                 proxy: str | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._allow_private = allow_private
        self.allow_private = allow_private  # the targets' rule, whatever the proxy's
        self._proxy = proxy
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
        self._free: list[_Handle] = []
        self._busy: dict[pycurl.Curl, _Handle] = {}
        self._timer: asyncio.Handle | None = None
        self._timer_at = 0.0  # when self._timer fires, on the loop's clock
        self._watched: set[int] = set()  # the sockets the loop watches for libcurl
        self._epoll = (_Epoll(self._loop, self._socket_action, self._read_info)
                       if watch_with_epoll and hasattr(select, "epoll") else None)
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_SOCKETFUNCTION,
                           self._on_socket if self._epoll is None else self._epoll.on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._multi.setopt(pycurl.M_MAX_TOTAL_CONNECTIONS, max(1, max_connections))
        self._multi.setopt(pycurl.M_MAXCONNECTS, max(1, max_connections))
        self._closed = False

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
        transfer = _Transfer(self._loop.create_future(), host, port, self._body_limit)
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
            curl.setopt(pycurl.CONNECT_TO, _connect_to(host, port, resolve))
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
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for curl, handle in list(self._busy.items()):
            self._busy.pop(curl)
            self._multi.remove_handle(curl)
            transfer = handle.transfer
            if transfer is not None and not transfer.future.done():
                transfer.future.set_exception(AttemptError("the worker is stopping"))
        for handle in self._free:
            handle.curl.close()
        self._free.clear()
        for fd in self._watched:
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
        self._watched.clear()
        if self._epoll is not None:
            self._epoll.close()
        self._multi.close()
        self._share.close()
        await self._resolver.close()

    def _new_handle(self) -> _Handle:
        handle = pycurl.Curl()
        for option, value in (
                (pycurl.NOSIGNAL, 1),
                (pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS),
                (pycurl.REDIR_PROTOCOLS, 0),
                (pycurl.FOLLOWLOCATION, 0),
                (pycurl.PROXY, ""),  # none, whatever the environment says
                (pycurl.HTTP_CONTENT_DECODING, 0),
                (pycurl.HTTP_TRANSFER_DECODING, 1),
                (pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1),
                (pycurl.CONNECTTIMEOUT_MS, self._connect_ms),
                (pycurl.DNS_CACHE_TIMEOUT, int(DNS_TTL)),
                (pycurl.POST, 1),
                (pycurl.NOPROGRESS, 1),
                (pycurl.TCP_NODELAY, 1),
                # Small buffers: at most BODY_LIMIT bytes of an answer's body are kept, and
                # thousands of transfers may be under way (their buffers are the worker's
                # memory per delivery in flight).
                (pycurl.BUFFERSIZE, 4096),
                (pycurl.UPLOAD_BUFFERSIZE, 16384),
                (pycurl.SSL_VERIFYPEER, 1),
                (pycurl.SSL_VERIFYHOST, 2),
        ):
            handle.setopt(option, value)
        if self._ca is not None:
            handle.setopt(pycurl.CAINFO, self._ca)
        handle.setopt(pycurl.SHARE, self._share)
        if self._proxy is not None:
            handle.setopt(pycurl.PROXY, self._proxy)
            handle.setopt(pycurl.PROXYTYPE, pycurl.PROXYTYPE_HTTP)
            handle.setopt(pycurl.HTTPPROXYTUNNEL, 1)
            handle.setopt(pycurl.NOPROXY, "")
            # The proxy's answer to CONNECT reaches the header callback first; the target's
            # own status line starts its answer over (_Transfer.header).
        # Every socket goes to the proxy when there is one: the operator's address.
        return _Handle(handle, self._allow_private or self._proxy is not None)

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

    # The loop's side of libcurl's multi socket interface.

    def _on_socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        loop = self._loop
        if what == pycurl.POLL_REMOVE:
            loop.remove_reader(fd)
            loop.remove_writer(fd)
            self._watched.discard(fd)
            return
        self._watched.add(fd)
        if what & pycurl.POLL_IN:
            loop.add_reader(fd, self._act, fd, pycurl.CSELECT_IN)
        else:
            loop.remove_reader(fd)
        if what & pycurl.POLL_OUT:
            loop.add_writer(fd, self._act, fd, pycurl.CSELECT_OUT)
        else:
            loop.remove_writer(fd)

    def _on_timer(self, ms: int) -> None:
        # libcurl asks for one timeout at a time, each replacing the one before; most ask
        # for "now" (a transfer added), which the loop runs without its timer heap. A
        # timer already set for (about) the same moment is kept.
        loop = self._loop
        timer = self._timer
        if ms < 0 or self._closed:
            if timer is not None:
                timer.cancel()
                self._timer = None
            return
        at = loop.time() + ms / 1000.0 if ms else 0.0
        if timer is not None:
            if abs(self._timer_at - at) < 0.001:
                return
            timer.cancel()
        self._timer_at = at
        self._timer = (loop.call_soon(self._timeout) if not ms
                       else loop.call_at(at, self._timeout))

    def _timeout(self) -> None:
        self._timer = None
        self._act(pycurl.SOCKET_TIMEOUT, 0)

    def _act(self, fd: int, events: int) -> None:
        self._socket_action(fd, events)
        self._read_info()

    def _socket_action(self, fd: int, events: int) -> None:
        if self._closed:
            return
        multi = self._multi
        while True:
            ret, _ = multi.socket_action(fd, events)
            if ret != pycurl.E_CALL_MULTI_PERFORM:
                break

    def _read_info(self) -> None:
        if self._closed:
            return
        while True:
            queued, done, failed = self._multi.info_read()
            for handle in done:
                self._finish(handle, None, "")
            for handle, code, message in failed:
                self._finish(handle, code, message)
            if not queued:
                break

    def _finish(self, curl: pycurl.Curl, code: int | None, message: str) -> None:
        handle = self._busy.pop(curl, None)
        self._multi.remove_handle(curl)
        transfer = None if handle is None else handle.transfer
        if transfer is None or transfer.future.done():
            return
        status = int(curl.getinfo(pycurl.RESPONSE_CODE) or 0)
        if code is None or (code in _BODY_ERRORS and status and not transfer.too_large):
            transfer.future.set_result(status)
        elif self._proxy is not None and int(curl.getinfo(pycurl.HTTP_CONNECTCODE) or 200
                                             ) != 200:
            # The proxy refused the tunnel (407, 502, ...): its answer is the record's.
            transfer.future.set_exception(AttemptError(
                f"the delivery proxy answered HTTP {curl.getinfo(pycurl.HTTP_CONNECTCODE)} "
                f"to CONNECT for {transfer.where}: {message}"))
        else:
            transfer.future.set_exception(_error(transfer, code, message))


def _connect_to(host: str, port: int, resolve: list[str]) -> list[str]:
    """The CURLOPT_CONNECT_TO entry that sends `host:port` to one of its checked addresses
    (from the CURLOPT_RESOLVE entry `+host:port:addr,...`), IPv4 first (a proxy tries the
    one address it is given); none for an IP literal, which was checked before."""
    if not resolve:
        return []
    addresses = resolve[0].split(f"{host}:{port}:", 1)[1].split(",")
    chosen = next((a for a in addresses if not a.startswith("[")), addresses[0])
    return [f"{host}:{port}:{chosen}:{port}"]


def _error(transfer: _Transfer, code: int, message: str) -> Exception:
    """What a failed transfer raises: its reason in the words the records use."""
    if transfer.refused is not None:
        return TargetRejected(transfer.refused)
    if transfer.too_large:
        return AttemptError(f"the answer's headers exceed {MAX_HEADER_BYTES // 1024} KiB")
    if code == pycurl.E_OPERATION_TIMEDOUT:
        return TimeoutError(message)
    if code == pycurl.E_COULDNT_CONNECT:
        return AttemptError(f"cannot connect to {transfer.where}: {message}")
    if code in (pycurl.E_PEER_FAILED_VERIFICATION, pycurl.E_SSL_CACERT_BADFILE,
                 pycurl.E_SSL_CONNECT_ERROR):
        return AttemptError(f"TLS with {transfer.where} failed: {message}")
    return AttemptError(message or f"transfer failed (libcurl error {code})")
