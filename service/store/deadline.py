"""Client-side deadlines on the database: a connection that stops answering never holds
the service.

A connection can die without an error: a proxy or pooler that hangs keeps the TCP
connection open and forwards nothing, a NAT that forgot it drops every packet, a failover
leaves the old primary's connections talking to a host that is gone. The kernel's
keepalives and tcp_user_timeout (service.db.network_options) notice the last two after a
while; none of them notices the first. So every checkout from a pool and every statement
has a deadline of its own kind of work (Store's `timeout`), and a request of the API one
for all its database work together (`budget`). Past a statement's deadline its connection
is abandoned: the server is asked to cancel the statement (where it can still be reached)
and the connection's socket is shut down, which wakes psycopg at once with a lost
connection; the pool replaces it. The next connection to the same server and database that
works ends the abandoned one's backend (`end_abandoned`): a cancel request does not end a
transaction, and a backend that stopped in the middle of a pipeline or a result would hold
its locks for as long as a hung proxy holds on.

A checkout also looks at what it is handed (`usable`): an idle connection whose socket
has something to read was closed by the server (a restart, a failover, a terminated
backend: the server says so before it closes) and is replaced at once, without a round
trip; one idle for IDLE_CHECK or more proves itself with a round trip first, within
PING_TIMEOUT, and when one fails, every connection idle since is replaced without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import weakref
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from service.db import raw_query, shut_down
from service.store.errors import StoreUnavailable

log = logging.getLogger("webhooks.db")

# A pooled connection idle this long makes a round trip before it is used.
IDLE_CHECK = 1.0
# The longest that round trip may take (less when the caller's deadline is nearer).
PING_TIMEOUT = 1.0
# How long the cancellation of an abandoned statement may take.
CANCEL_TIMEOUT = 5.0


class Budget:
    """The time the current request may still spend waiting for the database."""

    def __init__(self, seconds: float) -> None:
        self.total = seconds
        self.left = seconds


# The current request's budget (the API's, set per request); None outside a request.
_BUDGET: ContextVar[Budget | None] = ContextVar("webhooks_db_budget", default=None)

# When each pooled connection was last handed back (loop time).
_released: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = \
    weakref.WeakKeyDictionary()
# Per pool: when a connection last failed its check; the connections idle since before
# then are presumed dead as well (what broke one idle connection, a hung proxy or a
# vanished host, broke them all), and replaced without a round trip each.
_suspect: weakref.WeakKeyDictionary[AsyncConnectionPool, float] = weakref.WeakKeyDictionary()
# Cancellations under way (kept referenced until they end).
_cancelling: set[asyncio.Task[None]] = set()
# The backends of abandoned connections, per server, database and role: (pid, loop time of
# the abandonment); ended from the next connection there that works (end_abandoned).
Server = tuple[str, str, str, str]
_abandoned: dict[Server, list[tuple[int, float]]] = {}
# An abandoned backend not ended within this many seconds is forgotten (the server ended it,
# or the service may not: another role's connection).
ABANDONED_FOR = 600.0


def _server(conn: psycopg.AsyncConnection[Any]) -> Server:
    info = conn.info
    return (info.host, str(info.port), info.dbname, info.user)


class DeadlineExceeded(StoreUnavailable):
    """The database did not answer in time; the connection was abandoned."""


@contextlib.contextmanager
def budget(seconds: float) -> Iterator[None]:
    """The checkouts and statements inside wait for the database `seconds` at most, all
    together (the time between them, a handshake's say, is not counted)."""
    token = _BUDGET.set(Budget(seconds))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def remaining(seconds: float) -> float:
    """`seconds`, or what is left of the current budget if that is less; raises
    DeadlineExceeded when nothing is left."""
    current = _BUDGET.get()
    if current is None:
        return seconds
    if current.left <= 0:
        raise DeadlineExceeded(f"the request waited {current.total:g}s for the database")
    return min(seconds, current.left)


def first_try(seconds: float) -> float:
    """The deadline of a statement that may be sent again: `seconds`, or half of what is
    left of the current budget if that is less, so that the second try has time too."""
    current = _BUDGET.get()
    if current is None:
        return seconds
    return min(seconds, max(current.left / 2, 0.001))


@contextlib.contextmanager
def charged() -> Iterator[None]:
    """The time spent inside is taken from the current budget, if any."""
    current = _BUDGET.get()
    if current is None:
        yield
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        yield
    finally:
        current.left -= loop.time() - start


def abandon(conn: psycopg.AsyncConnection[Any]) -> None:
    """Shuts `conn` down now and asks the server to cancel what it runs (in the
    background, at most CANCEL_TIMEOUT)."""
    if conn.closed:
        return
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return  # lost already: psycopg is failing what waits on it
    # The cancellation's first step makes its request from the connection's key, before
    # psycopg sees the shut-down socket and the pool closes the connection (the same turn
    # of the loop, ahead of the socket's event).
    task = asyncio.ensure_future(_cancel(conn))
    _cancelling.add(task)
    task.add_done_callback(_cancelling.discard)
    now = asyncio.get_running_loop().time()
    for key in [k for k, waiting in _abandoned.items() if now - waiting[-1][1] >= ABANDONED_FOR]:
        del _abandoned[key]  # a server or database no connection was taken from since
    with contextlib.suppress(psycopg.Error):
        _abandoned.setdefault(_server(conn), []).append((conn.pgconn.backend_pid, now))
    shut_down(fd)


async def end_abandoned(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Ends, from `conn`, the backends abandoned on its server and database, if any; False
    when `conn` itself failed (they wait for the next connection)."""
    key = _server(conn)
    now = asyncio.get_running_loop().time()
    waiting = [(pid, at) for pid, at in _abandoned.pop(key, ()) if now - at < ABANDONED_FOR]
    if not waiting:
        return True
    text, _ = raw_query("end_abandoned")
    try:
        with watched(conn, PING_TIMEOUT, charge=False):
            cur = await psycopg.AsyncRawCursor(conn).execute(
                text, [[pid for pid, _ in waiting], [now - at for _, at in waiting]])
            row = await cur.fetchone()
    except (psycopg.Error, OSError, StoreUnavailable) as exc:
        if conn.closed or conn.broken or isinstance(exc, StoreUnavailable):
            _abandoned.setdefault(key, []).extend(waiting)
            return False
        log.warning("could not end the backends of abandoned database connections: %s", exc)
        return True
    if row and row[0]:
        log.warning("ended %d backend(s) of abandoned database connections", row[0])
    return True


async def _cancel(conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        await conn.cancel_safe(timeout=CANCEL_TIMEOUT)
    except Exception as exc:  # the server may be what does not answer
        log.info("cancelling an abandoned statement failed: %s", exc)


@contextlib.contextmanager
def watched(conn: psycopg.AsyncConnection[Any], seconds: float, *,
            charge: bool = True) -> Iterator[None]:
    """The statements inside end within `seconds` (or the budget), or `conn` is abandoned
    and DeadlineExceeded raised; their time is taken from the budget, if `charge`."""
    seconds = remaining(seconds)
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        log.warning("no answer from the database within %.3gs: abandoning the connection",
                    seconds)
        abandon(conn)

    handle = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        if charge:
            with charged():
                yield
        else:
            yield
    except (psycopg.Error, OSError) as exc:
        if fired:
            raise DeadlineExceeded(f"the database did not answer within {seconds:.3g}s; "
                                   "the connection was abandoned") from exc
        raise
    finally:
        handle.cancel()


def made_now(conn: psycopg.AsyncConnection[Any]) -> None:
    """Marks a new pooled connection as answering now: one the pool made but nobody used
    for a second or more proves itself before use, as an idle one does."""
    _released[conn] = asyncio.get_running_loop().time()


def _readable(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection's socket has something to read: the server's goodbye
    (or its end of file). An idle connection of the service is sent nothing else."""
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


async def usable(pool: AsyncConnectionPool, conn: psycopg.AsyncConnection[Any],
                 timeout: float) -> bool:
    """Whether the pooled `conn` may be handed out (see the module's docstring)."""
    if conn.closed or conn.pgconn.status != pq.ConnStatus.OK:
        return False
    released = _released.get(conn)
    if released is None:
        return True  # a pool that does not mark its new connections (made_now)
    if released <= _suspect.get(pool, float("-inf")):
        return False
    try:
        if _readable(conn):
            return False
    except (OSError, ValueError, psycopg.Error):
        return False
    loop = asyncio.get_running_loop()
    if loop.time() - released < IDLE_CHECK:
        return True
    try:
        with watched(conn, min(PING_TIMEOUT, timeout), charge=False):
            await conn.execute("")
    except (psycopg.Error, OSError, StoreUnavailable):
        _suspect[pool] = loop.time()
        return False
    return True


@contextlib.asynccontextmanager
async def checked_out(pool: AsyncConnectionPool, timeout: float
                      ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection of `pool` that passed `usable`, within `timeout` (or the budget);
    handed back when the block ends. Connections that fail are closed (the pool replaces
    them) and the next is tried at once."""
    loop = asyncio.get_running_loop()
    timeout = remaining(timeout)
    end = loop.time() + timeout
    with charged():
        while True:
            left = end - loop.time()
            if left <= 0:
                raise DeadlineExceeded(f"no usable database connection within {timeout:g}s")
            try:
                conn = await pool.getconn(timeout=left)
            except PoolTimeout as exc:
                raise DeadlineExceeded(f"no database connection within {timeout:g}s") from exc
            try:
                ok = await usable(pool, conn, end - loop.time())
                if ok and _abandoned:
                    ok = await end_abandoned(conn)
            except BaseException:
                await pool.putconn(conn)
                raise
            if ok:
                break
            await conn.close()
            await pool.putconn(conn)
    try:
        yield conn
    except DeadlineExceeded:
        # What hung this connection (a proxy, a vanished host) holds the idle ones too:
        # they are replaced rather than tried.
        _suspect[pool] = loop.time()
        raise
    finally:
        _released[conn] = loop.time()
        await pool.putconn(conn)
