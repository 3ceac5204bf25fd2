"""A database not migrated yet: /readyz and every API request answer 503 saying to run
`webhooks migrate`, the worker says so in one line and waits quietly until it is, and
/readyz answers within a second whatever the database does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from service import db, tokens
from service.config import Settings
from tests.support.api import assert_error, serving
from tests.support.net import free_port

MIGRATE = "webhooks migrate"


async def test_the_api_answers_503_until_the_database_is_migrated(empty_db: str) -> None:
    token = tokens.new_token()
    headers = {"Authorization": f"Bearer {token}"}
    async with serving(Settings(database_url=empty_db)) as url, \
            httpx.AsyncClient(base_url=url, timeout=10) as http:
        assert_error(await http.get("/readyz"), 503, MIGRATE)
        for method, path in (("GET", "/api/v1/webhooks"), ("GET", "/api/v1/hook_events"),
                             ("POST", "/api/v1/webhooks/"), ("GET", "/api/v1/webhooks/1")):
            # With a token or without one: the tokens' table is not there either.
            assert_error(await http.request(method, path, headers=headers, json={}), 503,
                         MIGRATE)
            assert_error(await http.request(method, path, json={}), 503, MIGRATE)
        assert (await http.get("/healthz")).status_code == 200

        # Migrated while the API runs: it serves at once, without a restart.
        await asyncio.to_thread(db.migrate, empty_db)
        assert (await http.get("/readyz")).json() == {"status": "ok"}
        with psycopg.connect(empty_db, autocommit=True) as conn:
            token = tokens.create(conn, "alice")[1]
        listed = await http.get("/api/v1/webhooks", headers={"Authorization": f"Bearer {token}"})
        assert listed.status_code == 200, listed.text

        # The service's tables gone again: requests say so rather than fail with a 500.
        with psycopg.connect(empty_db, autocommit=True) as conn:
            conn.execute("DROP SCHEMA webhooks CASCADE")
        for _ in range(2):
            assert_error(await http.get("/api/v1/webhooks",
                                        headers={"Authorization": f"Bearer {token}"}),
                         503, MIGRATE)
        assert_error(await http.get("/readyz"), 503, MIGRATE)


async def test_a_database_of_an_older_version_is_not_ready(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        latest = conn.execute("SELECT max(migration_id) FROM webhooks._yoyo_migration"
                              ).fetchone()[0]  # type: ignore[index]
        conn.execute("DELETE FROM webhooks._yoyo_migration WHERE migration_id = %s", (latest,))
    async with serving(Settings(database_url=db_url)) as url, \
            httpx.AsyncClient(base_url=url, timeout=10) as http:
        error = assert_error(await http.get("/readyz"), 503, MIGRATE)
        assert "for this version (1 migration to apply)" in error
        assert_error(await http.get("/api/v1/webhooks"), 503, MIGRATE)


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A port that accepts connections and never answers: a hung database."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    port = free_port()
    server = await asyncio.start_server(hold, "127.0.0.1", port)
    try:
        yield port
    finally:
        server.close()
        for writer in held:
            writer.close()


async def test_readyz_answers_within_a_second_when_the_database_hangs() -> None:
    async with silent_server() as port:
        settings = Settings(database_url=f"postgresql://postgres@127.0.0.1:{port}/postgres")
        async with serving(settings) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
            for _ in range(3):
                started = time.monotonic()
                response = await http.get("/readyz")
                took = time.monotonic() - started
                assert_error(response, 503, "database")
                assert took < 1.0, took


async def test_readyz_answers_within_a_second_when_queries_hang(db_url: str) -> None:
    # Connected, then the statements hang: an exclusive lock on yoyo's table.
    async with serving(Settings(database_url=db_url)) as url, \
            httpx.AsyncClient(base_url=url, timeout=10) as http:
        assert (await http.get("/readyz")).status_code == 200
        with psycopg.connect(db_url) as locker:
            locker.execute("LOCK TABLE webhooks._yoyo_migration IN ACCESS EXCLUSIVE MODE")
            for _ in range(3):
                started = time.monotonic()
                response = await http.get("/readyz")
                took = time.monotonic() - started
                assert_error(response, 503, "did not answer")
                assert took < 1.0, took
            locker.rollback()
        deadline = time.monotonic() + 10
        while (await http.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, "/readyz did not recover"
            await asyncio.sleep(0.05)


@contextlib.contextmanager
def worker(url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service", "worker"],
                                env={**os.environ, "DATABASE_URL": url}, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for_line(log: Path, fragment: str, proc: subprocess.Popen[bytes],
                  timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        if fragment in text:
            return text
        assert proc.poll() is None, f"the worker exited: {text}"
        assert time.monotonic() < deadline, f"no {fragment!r} in {timeout}s: {text}"
        time.sleep(0.05)


def test_the_worker_says_once_that_the_database_is_not_migrated_then_starts(
        empty_db: str, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    with worker(empty_db, log) as proc:
        wait_for_line(log, MIGRATE, proc)
        db.migrate(empty_db)
        text = wait_for_line(log, "worker started", proc)
    lines = text[:text.index("worker started")].splitlines()
    said = [line for line in lines if MIGRATE in line]
    assert len(said) == 1, lines
    assert "not migrated" in said[0]
    # Quiet meanwhile: no other warning while it waited (the migrate took a second or so).
    assert [line for line in lines if "WARNING" in line or "ERROR" in line] == said, lines


@pytest.mark.parametrize("argv", [["status"], ["token", "list"]])
def test_the_cli_says_to_migrate(empty_db: str, argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "service", *argv],
                          env={**os.environ, "DATABASE_URL": empty_db}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert MIGRATE in done.stderr
