"""One POST under way (Transfer), the easy handle that carries it (Handle), and what a
failed one raises (error()): the client's per-transfer side of libcurl's callbacks."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pycurl

from service.ssrf import TargetRejected, check_address

# The most response-header bytes read; a target that sends more fails the attempt.
MAX_HEADER_BYTES = 64 * 1024

# libcurl errors after which the answer that came (status and headers) still counts: the
# body was cut short, by the target or by us once BODY_LIMIT bytes were read.
BODY_ERRORS = frozenset({pycurl.E_WRITE_ERROR, pycurl.E_PARTIAL_FILE, pycurl.E_RECV_ERROR,
                         pycurl.E_GOT_NOTHING})


class AttemptError(Exception):
    """An attempt that got no usable answer: the message says why, for the record."""


class Transfer:
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


class Handle:
    """A libcurl easy handle, its callbacks (set once: they act on whatever transfer the
    handle carries) and the options it was last given, which stay set between transfers
    and are only given again when they change."""

    __slots__ = ("allow_private", "curl", "timeout_ms", "transfer", "url")

    def __init__(self, curl: pycurl.Curl, allow_private: bool) -> None:
        self.curl = curl
        self.allow_private = allow_private
        self.transfer: Transfer | None = None
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


def error(transfer: Transfer, code: int, message: str) -> Exception:
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
