"""The LISTEN connection: wakes the worker when a transaction that captured changes commits.

It lives outside the pool, in autocommit, and never holds a transaction open. A
notification only says "look": the outbox and deliveries tables are the truth, so after
every (re)connection the worker is woken once to catch up on what it may have missed.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from service.store import Session, StoreError, connect, translated

log = logging.getLogger("webhooks.listener")

APPLICATION_NAME = "webhooks-listener"


class Listener:
    """Keeps a LISTEN webhooks connection up, reconnecting with backoff and jitter."""

    def __init__(self, url: str, wake: Callable[[], None], *, min_backoff: float = 0.1,
                 max_backoff: float = 10.0) -> None:
        self._url = url
        self._wake = wake
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self.connected = asyncio.Event()
        self.connections = 0  # successful connections so far; tests watch reconnects
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
        """Connects, listens and wakes the worker until the connection breaks (StoreError)."""
        with translated():
            conn = await connect(
                self._url, application_name=APPLICATION_NAME,
                # Notice a silently dead peer (a cable, a NAT) rather than wait forever.
                keepalives=1, keepalives_idle=30, keepalives_interval=10, keepalives_count=3,
            )
            async with conn:
                await Session(conn).listen()
                self.pid = conn.info.backend_pid
                self.connections += 1
                self.connected.set()
                self._wake()  # anything committed while we were not listening
                async for _ in conn.notifies():
                    self._wake()
