"""A worker that starts while `webhooks migrate` runs waits for it to end: between the
numbered migrations and the functions installed after them the database looks migrated,
and a worker that started then prepared statements calling functions not there yet."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest

from service.availability import migration_under_way, wait_until_migrated
from service.db import MIGRATION_LOCK
from tests.support.worker import poll


async def test_a_worker_waits_for_a_running_migrate(db_url: str, conn: psycopg.Connection,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="webhooks.availability")
    check = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    try:
        assert not await migration_under_way(check)
        migrate = psycopg.connect(db_url, autocommit=True)  # holds the lock as migrate does
        try:
            migrate.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
            assert await migration_under_way(check)
            stop = asyncio.Event()
            waiting = asyncio.ensure_future(wait_until_migrated(db_url, stop, every=0.1))
            await poll(lambda: "is running" in caplog.text, timeout=10,
                       what="the wait says migrate is running")
            assert not waiting.done()
            migrate.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
            assert await asyncio.wait_for(waiting, 10) is True
        finally:
            migrate.close()
        assert not await migration_under_way(check)
    finally:
        await check.close()
    assert "not migrated" not in caplog.text
