"""Start-up and command-line failures: the API binds at once whatever the database does and
serves again when it comes back; the worker waits for it, a line a try; every CLI failure
is one line and a non-zero exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from service import tokens
from tests.support.net import free_port


def via_port(url: str, port: int) -> str:
    """`url` reaching its server through 127.0.0.1:`port`."""
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, f"{user}127.0.0.1:{port}", parts.path, parts.query,
                       parts.fragment))


@contextlib.asynccontextmanager
async def forwarding(port: int, to_url: str) -> AsyncIterator[None]:
    """The database server of `to_url` reachable on 127.0.0.1:`port` until the block ends:
    a database that "comes back"."""
    target = urlsplit(to_url)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(target.hostname or "127.0.0.1",
                                                             target.port or 5432)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()


def cli(args: list[str], url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service", *args],
                          env={**os.environ, "DATABASE_URL": url},
                          capture_output=True, text=True, timeout=60)


async def poll_http(client: httpx.AsyncClient, path: str, status: int, headers: dict[str, str],
                    timeout: float = 20.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.TransportError):
            response = await client.get(path, headers=headers)
            if response.status_code == status:
                return response
        assert time.monotonic() < deadline, f"{path} did not answer {status} in {timeout}s"
        await asyncio.sleep(0.1)


async def test_the_api_binds_while_the_database_is_down_and_serves_when_it_is_back(
        db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        token = tokens.create(conn, "alice", None)[1]
    db_port, api_port = free_port(), free_port()
    env = {**os.environ, "DATABASE_URL": via_port(db_url, db_port)}
    process = subprocess.Popen([sys.executable, "-m", "service", "api", "--port", str(api_port)],
                               env=env, stderr=subprocess.PIPE, text=True)
    auth = {"Authorization": f"Bearer {token}"}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}",
                                     timeout=15) as client:
            await poll_http(client, "/healthz", 200, {}, timeout=10)
            ready = await client.get("/readyz")
            assert ready.status_code == 503 and "error" in ready.json()
            down = await client.get("/api/v1/webhooks/", headers=auth)
            assert down.status_code == 503, down.text
            assert down.json() == {"error": "the database is unavailable; try again later"}

            async with forwarding(db_port, db_url):
                await poll_http(client, "/readyz", 200, {})
                listed = await client.get("/api/v1/webhooks/", headers=auth)
                assert listed.status_code == 200 and listed.json() == []
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert "Traceback" not in stderr


async def test_the_worker_waits_for_the_database_a_line_a_try(db_url: str) -> None:
    db_port = free_port()
    env = {**os.environ, "DATABASE_URL": via_port(db_url, db_port),
           "WEBHOOKS_LOG_LEVEL": "INFO"}
    process = subprocess.Popen([sys.executable, "-m", "service", "worker"], env=env,
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    try:
        lines = [await asyncio.to_thread(process.stderr.readline) for _ in range(2)]
        assert all("waiting for the database" in line for line in lines), lines
        async with forwarding(db_port, db_url):
            # Once the database answers, the worker connects and starts.
            deadline = time.monotonic() + 30
            with psycopg.connect(db_url, autocommit=True) as conn:
                while not conn.execute("SELECT count(*) FROM pg_stat_activity"
                                       " WHERE application_name = 'webhooks-worker'"
                                       ).fetchone()[0]:  # type: ignore[index]
                    assert time.monotonic() < deadline, "the worker never connected"
                    await asyncio.sleep(0.1)
            process.terminate()
            _, rest = await asyncio.to_thread(process.communicate, timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, rest
    assert "Traceback" not in rest


NOT_A_URI = ("localhost:5432", "DATABASE_URL is not a PostgreSQL URI")
NOT_VALID = ("postgresql://u:hunter2@[::1", "DATABASE_URL is not a valid PostgreSQL URI")
UNREACHABLE = ("postgresql://postgres:hunter2@127.0.0.1:9/x", "cannot reach the database")


# Every kind of failure with one command, and every command with one failure: a URL that
# does not parse stops each command alike, before it runs (the URL forms, and every
# command, in process: tests/unit/test_config.py, tests/unit/test_printable.py).
@pytest.mark.parametrize(("command", "url", "says"), [
    (["status"], *NOT_A_URI),
    (["status"], *NOT_VALID),
    (["status"], *UNREACHABLE),
    (["migrate"], *UNREACHABLE),
    (["deliveries", "list", "1"], *UNREACHABLE),
    (["token", "list"], *UNREACHABLE),
])
def test_every_cli_failure_is_one_line(command: list[str], url: str, says: str) -> None:
    result = cli(command, url)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert "hunter2" not in result.stderr


@pytest.mark.parametrize("command", [["status"], ["deliveries", "list", "1"], ["token", "list"],
                                     ["status", "--json"]])
def test_a_database_not_migrated_yet_says_to_migrate(empty_db: str, command: list[str]
                                                     ) -> None:
    result = cli(command, empty_db)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "run `webhooks migrate`" in result.stderr
