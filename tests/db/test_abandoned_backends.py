"""The backends of abandoned connections end. The next connection that works ends them
(service.store.deadline, end_abandoned): only those that started before they were abandoned,
so a pid the server has given a new backend since is left alone. The server ends them too,
by the bounds the service's connections set by default: idle_in_transaction_session_timeout
on an idle transaction, its keepalives and tcp_user_timeout on a client host that vanished
(connections abandoned behind a proxy that hangs: tests/e2e/test_db_hangs.py)."""

from __future__ import annotations

import asyncio

import psycopg

from service.db import connect
from service.store import Store, deadline
from tests.support.worker import open_pool, poll


def alive(conn: psycopg.Connection, pid: int) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
                       ).fetchone()
    return row == (1,)


async def test_only_backends_older_than_their_abandonment_are_ended(
        db_url: str, conn: psycopg.Connection) -> None:
    before = psycopg.connect(db_url, autocommit=True)  # started before the abandonment
    try:
        await asyncio.sleep(0.05)
        abandoned_at = asyncio.get_running_loop().time()
        await asyncio.sleep(0.05)
        after = psycopg.connect(db_url, autocommit=True)  # as if its pid were reused since
        try:
            async with open_pool(db_url, max_size=1) as pool:
                async with pool.connection() as probe:
                    key = deadline._server(probe)
                deadline._abandoned[key] = [(before.info.backend_pid, abandoned_at),
                                           (after.info.backend_pid, abandoned_at)]
                await Store(pool).ping()  # its checkout ends what was abandoned there
            assert key not in deadline._abandoned
            await poll(lambda: not alive(conn, before.info.backend_pid), timeout=10,
                       what="the backend older than its abandonment ended")
            assert alive(conn, after.info.backend_pid)
        finally:
            after.close()
    finally:
        before.close()


def test_service_connections_bound_an_idle_transaction_by_default(db_url: str) -> None:
    with connect(db_url) as c:
        row = c.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    assert row == ("1min",)


def test_the_server_notices_a_vanished_client_by_default(db_url: str) -> None:
    """The server's keepalives and tcp_user_timeout are set on the service's connections
    (a third of WEBHOOKS_DB_TCP_TIMEOUT to the first probe, the whole of it unacknowledged),
    so that a backend whose client host vanished mid-statement ends instead of waiting
    with its locks for the operating system's two hours."""
    with connect(db_url) as c:
        row = c.execute("SELECT current_setting('tcp_keepalives_idle'),"
                        " current_setting('tcp_keepalives_count'),"
                        " current_setting('tcp_user_timeout')").fetchone()
    assert row == ("5", "4", "15000")
