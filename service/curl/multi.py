"""The loop's side of libcurl's multi socket interface: libcurl says which sockets to watch
and when its next timeout is due; the loop calls it back then, and the transfers that
ended settle their futures. On Linux the sockets are watched through one epoll object of
the client's own (Epoll), which the loop watches."""

from __future__ import annotations

import asyncio
import contextlib
import select
from typing import Any

import pycurl

from service.curl.transfer import BODY_ERRORS, AttemptError, Handle, error


class Epoll:
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


class MultiDriver:
    """One libcurl multi handle driven by the running loop: its transfers under way
    (`_busy`), its timer and the sockets watched for it. CurlClient adds the transfers."""

    def __init__(self, *, max_connections: int, watch_with_epoll: bool,
                 proxy: str | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._proxy = proxy
        self._busy: dict[pycurl.Curl, Handle] = {}
        self._timer: asyncio.Handle | None = None
        self._timer_at = 0.0  # when self._timer fires, on the loop's clock
        self._watched: set[int] = set()  # the sockets the loop watches for libcurl
        self._epoll = (Epoll(self._loop, self._socket_action, self._read_info)
                       if watch_with_epoll and hasattr(select, "epoll") else None)
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_SOCKETFUNCTION,
                           self._on_socket if self._epoll is None else self._epoll.on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._multi.setopt(pycurl.M_MAX_TOTAL_CONNECTIONS, max(1, max_connections))
        self._multi.setopt(pycurl.M_MAXCONNECTS, max(1, max_connections))
        self._closed = False

    def _close_multi(self) -> None:
        """Ends every transfer under way (AttemptError) and stops watching for libcurl."""
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

    def _unwatch(self) -> None:
        """Stops watching libcurl's sockets, and closes the multi handle."""
        for fd in self._watched:
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
        self._watched.clear()
        if self._epoll is not None:
            self._epoll.close()
        self._multi.close()

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
        if code is None or (code in BODY_ERRORS and status and not transfer.too_large):
            transfer.future.set_result(status)
        elif self._proxy is not None and int(curl.getinfo(pycurl.HTTP_CONNECTCODE) or 200
                                             ) != 200:
            # The proxy refused the tunnel (407, 502, ...): its answer is the record's.
            transfer.future.set_exception(AttemptError(
                f"the delivery proxy answered HTTP {curl.getinfo(pycurl.HTTP_CONNECTCODE)} "
                f"to CONNECT for {transfer.where}: {message}"))
        else:
            transfer.future.set_exception(error(transfer, code, message))
