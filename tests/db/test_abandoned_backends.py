"""The backends of abandoned connections are ended from the next connection that works
(service.store.deadline, end_abandoned): only those that started before they were abandoned,
so a pid the server has given a new backend since is left alone."""

from __future__ import annotations

import asyncio

import psycopg

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
