"""Waiting for the database at start-up: a worker started before PostgreSQL (a reboot, a
container that comes up first) waits for it, one log line per try, instead of failing."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg

from service.db import conninfo

log = logging.getLogger("webhooks.availability")


async def wait_for_database(url: str, stop: asyncio.Event, *, first: float = 1.0,
                            longest: float = 15.0) -> bool:
    """Returns True once a connection to `url` succeeds, False if `stop` is set first.
    Tries again after 1, 2, 4 ... seconds (at most `longest`), logging one line a try."""
    delay = first
    while not stop.is_set():
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo(url), connect_timeout=10)
        except psycopg.OperationalError as exc:
            reason = (str(exc).strip().splitlines() or ["unreachable"])[0]
            log.warning("waiting for the database (next try in %gs): %s", delay, reason)
        else:
            await conn.close()
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, longest)
    return False
