"""The settings the service pins whatever the database or its roles say: synchronous_commit
on (in the startup packet), and idle_session_timeout and transaction_timeout 0 on servers
that have them (set once connected: an older server refuses them at start-up)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from service import db
from service.store import Store, connect, make_pool
from tests.support.worker import poll


@pytest.fixture
def hostile(conn: psycopg.Connection) -> psycopg.Connection:
    """The test's database with defaults that undo durability and close idle sessions."""
    name = sql.Identifier(conn.info.dbname)
    conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(name))
    if conn.info.server_version >= 140000:
        conn.execute(sql.SQL("ALTER DATABASE {} SET idle_session_timeout = '300ms'")
                     .format(name))
    if conn.info.server_version >= 170000:
        conn.execute(sql.SQL("ALTER DATABASE {} SET transaction_timeout = '300ms'")
                     .format(name))
    return conn


def expected(version: int) -> dict[str, str]:
    pinned = {"synchronous_commit": "on"}
    if version >= 140000:
        pinned["idle_session_timeout"] = "0"
    if version >= 170000:
        pinned["transaction_timeout"] = "0"
    return pinned


def alive(conn: psycopg.Connection, pid: int) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                       (pid,)).fetchone()
    return row == (1,)


def shown(conn: psycopg.Connection, names: list[str]) -> dict[str, str]:
    return {n: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(n))).fetchone()[0]
            for n in names}


def test_the_statement_pins_only_what_the_server_knows() -> None:
    assert db.server_settings(130000) is None
    assert "idle_session_timeout" in (db.server_settings(140000) or "")
    assert "transaction_timeout" not in (db.server_settings(160000) or "")
    assert "transaction_timeout" in (db.server_settings(170000) or "")


def test_a_command_connection_pins_them(hostile: psycopg.Connection, db_url: str) -> None:
    with psycopg.connect(db_url) as plain:  # the database's defaults reach a plain one
        assert plain.execute("SHOW synchronous_commit").fetchone() == ("off",)
    want = expected(hostile.info.server_version)
    with db.connect(db_url) as conn:
        assert shown(conn, list(want)) == want


async def test_pooled_and_listen_connections_pin_them_and_stay_open_when_idle(
        hostile: psycopg.Connection, db_url: str) -> None:
    want = expected(hostile.info.server_version)
    pool = make_pool(db_url, min_size=1, max_size=1, name="t-pinned")
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            for name, value in want.items():
                cur = await conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name)))
                assert await cur.fetchone() == (value,), name
            pid = conn.info.backend_pid
        if hostile.info.server_version >= 140000:
            # A plain session idle as long is closed by the server meanwhile.
            plain = await psycopg.AsyncConnection.connect(db_url)
            plain_pid = plain.info.backend_pid
            await poll(lambda: not alive(hostile, plain_pid), timeout=10,
                       what="the plain idle session closed by idle_session_timeout")
            await plain.close()
        async with pool.connection() as conn:
            assert conn.info.backend_pid == pid  # not closed by the server, not replaced
        await Store(pool, 2.0).ping()
    finally:
        await pool.close()
    listen = await connect(db_url)
    try:
        cur = await listen.execute("SHOW synchronous_commit")
        assert await cur.fetchone() == ("on",)
    finally:
        await listen.close()
