"""Waiting for the database at start-up: a worker started before PostgreSQL (a reboot, a
container that comes up first) waits for it, one log line per try, instead of failing;
then, on a database not migrated for this version yet, says so once and waits quietly
until `webhooks migrate` has run. The API asks `not_migrated` too (service.api.readiness).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from service.db import MIGRATION_LOCK, MIGRATIONS_DIR, YOYO_SCHEMA, conninfo

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


MIGRATE_HINT = "run `webhooks migrate`"


def known_migrations() -> frozenset[str]:
    """The ids of this version's numbered migrations (yoyo's: the file names' stems)."""
    return frozenset(p.name.removesuffix(".sql") for p in MIGRATIONS_DIR.glob("*.sql")
                     if not p.name.endswith(".rollback.sql"))


async def not_migrated(conn: psycopg.AsyncConnection[Any]) -> str | None:
    """None when every numbered migration of this version is applied to the database of
    `conn` (a newer version's too are fine), else what to tell the operator. Two cheap
    catalogue reads; psycopg's errors are the caller's."""
    cur = await conn.execute("SELECT pg_catalog.to_regclass(%s) IS NOT NULL",
                             (f"{YOYO_SCHEMA}._yoyo_migration",))
    row = await cur.fetchone()
    if not row or not row[0]:
        return f"the database is not migrated: {MIGRATE_HINT}"
    cur = await conn.execute(f"SELECT migration_id FROM {YOYO_SCHEMA}._yoyo_migration")
    missing = known_migrations() - {r[0] for r in await cur.fetchall()}
    if missing:
        return (f"the database is not migrated for this version ({len(missing)} "
                f"migration{'s' if len(missing) > 1 else ''} to apply): {MIGRATE_HINT}")
    return None


async def migration_under_way(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether `webhooks migrate` holds its lock on the database of `conn` now: between its
    numbered migrations and the functions it installs after them, the database looks
    migrated and is not yet."""
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
        "   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d"
        "                      WHERE d.datname = pg_catalog.current_database())"
        "   AND l.classid = %s::oid AND l.objid = %s::oid)",
        (MIGRATION_LOCK >> 32, MIGRATION_LOCK & 0xFFFFFFFF))
    row = await cur.fetchone()
    return bool(row and row[0])


async def wait_until_migrated(url: str, stop: asyncio.Event, *, every: float = 2.0) -> bool:
    """Returns True once the database at `url` is migrated for this version, False if
    `stop` is set first. Says so in one log line when it is not, then looks again every
    `every` seconds without a word (a connection failure meanwhile too: the loop that
    follows reports those), and in one line when it is. While `webhooks migrate` runs it
    waits for the end (migration_under_way), looking every half second."""
    said = running = False
    while not stop.is_set():
        try:
            conn = await psycopg.AsyncConnection.connect(conninfo(url), connect_timeout=10,
                                                         autocommit=True)
            try:
                reason = await not_migrated(conn)
                if reason is None and await migration_under_way(conn):
                    reason = "under way"
            finally:
                await conn.close()
        except psycopg.Error as exc:
            log.debug("could not check the database's migrations: %s", exc)
            reason = "unknown"
        if reason is None:
            if said:
                log.info("the database is migrated now; starting")
            return True
        if reason == "under way":
            if not running:
                log.info("`webhooks migrate` is running; waiting until it ends")
            running = True
            every = min(every, 0.5)
        elif not said and reason != "unknown":
            log.warning("%s; waiting until it is", reason)
            said = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
    return False
