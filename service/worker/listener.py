"""The LISTEN connection: wakes the worker when a transaction that captured changes commits.

It lives outside the pool, in autocommit, and never holds a transaction open. A
notification only says "look": the outbox and deliveries tables are the truth, so after
every (re)connection the worker is woken once to catch up on what it may have missed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from service.store import Session, StoreError, connect, translated

log = logging.getLogger("webhooks.listener")

APPLICATION_NAME = "webhooks-listener"


class Listener:
    """Keeps a LISTEN webhooks connection up, reconnecting with backoff and jitter, and
    proves it alive every `check_interval` seconds with a round trip that must end within
    `timeout`: a connection that stops answering (a hung proxy, a vanished host) is
    abandoned and replaced, and meanwhile the worker polls the outbox (wakeup.py, point
    5: no pid, no NOTIFY expected)."""

    def __init__(self, url: str, wake: Callable[[], None], *, min_backoff: float = 0.1,
                 max_backoff: float = 10.0, check_interval: float = 10.0,
                 timeout: float = 10.0, tcp_timeout: float = 15.0,
                 connect_timeout: float = 5.0,
                 report: Callable[[], dict[str, Any]] | None = None,
                 proved: Callable[[float], None] | None = None,
                 opened: Callable[[], None] | None = None) -> None:
        self._url = url
        self._wake = wake
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._check_interval = check_interval
        self._timeout = timeout
        self._tcp_timeout = tcp_timeout
        self._connect_timeout = connect_timeout
        self._report = report
        self._proved = proved
        self._opened = opened  # told of each LISTEN connection made
        self.connected = asyncio.Event()
        self.pid: int | None = None  # backend pid of the current LISTEN connection

    async def run(self) -> None:
        """Listens until cancelled; connection failures are logged and retried. Anything
        else propagates (the worker's supervisor logs it and calls run() again), and the
        listener is then no longer marked connected."""
        backoff = self._min_backoff
        try:
            while True:
                try:
                    await self._listen_once()
                except StoreError as exc:
                    log.warning("LISTEN connection lost, reconnecting: %s", exc)
                self.pid = None  # no NOTIFY can come: the worker polls meanwhile
                if self.connected.is_set():
                    # It was up: this is a fresh failure, so start the backoff over.
                    self.connected.clear()
                    backoff = self._min_backoff
                await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
                backoff = min(backoff * 2, self._max_backoff)
        finally:
            self.connected.clear()
            self.pid = None

    async def _listen_once(self) -> None:
        """Connects, listens and wakes the worker until the connection breaks or fails its
        proof (StoreError)."""
        with translated():
            conn = await connect(self._url, application_name=APPLICATION_NAME,
                                 tcp_timeout=self._tcp_timeout,
                                 connect_timeout=self._connect_timeout)
            async with conn:
                session = Session(conn, self._timeout)
                await self._prove(session)
                await session.listen()
                self.pid = conn.info.backend_pid
                if self._opened is not None:
                    self._opened()
                self.connected.set()
                self._wake()  # anything committed while we were not listening
                while True:
                    async for _ in conn.notifies(timeout=self._check_interval):
                        self._wake()
                    await self._prove(session)

    async def _prove(self, session: Session) -> None:
        """One round trip within the deadline, reporting the worker's progress."""
        report = dict(self._report()) if self._report is not None else {}
        now = time.time()
        report["proof"] = now
        await session.prove_listener(json.dumps(report, sort_keys=True))
        if self._proved is not None:
            self._proved(now)
