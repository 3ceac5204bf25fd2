"""Faults: competing workers, a killed worker, SIGTERM, lost connections, shutdown."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import psycopg
import pytest
from aiohttp import web

from service.worker import outbox
from service.worker.fanout import FANOUT_LOCK
from service.worker.loop import open_worker
from tests.support.receivers import Received, Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import (
    add_invoice,
    listen_connections,
    make_settings,
    metric,
    running_worker,
    worker_env,
)

WEBHOOKS = str(Path(sys.executable).with_name("webhooks"))


def distinct_ids(receiver: Receiver) -> set[str]:
    return {r.headers["webhook-id"] for r in receiver.deliveries()}


async def wait_until(check: object, timeout: float = 10.0, what: str = "condition") -> None:
    """Polls `check()` (a callable returning truthy) until it holds or the deadline passes."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not met in {timeout}s"
        await asyncio.sleep(0.02)


def listener_pids(conn: psycopg.Connection) -> list[int]:
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                        " AND application_name = 'webhooks-listener'").fetchall()
    return [r[0] for r in rows]


async def start_worker_process(db_url: str, log: Path, **env: str
                               ) -> asyncio.subprocess.Process:
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            WEBHOOKS, "worker", "--concurrency", "8", env=worker_env(db_url, **env),
            stdout=out, stderr=out)


async def test_two_workers_deliver_everything_once(db_url: str, conn: psycopg.Connection,
                                                   receiver: Receiver) -> None:
    """Two workers never claim the same delivery. The receiver answers in this process's
    event loop, which the parallel suite can starve for seconds: a generous delivery timeout
    keeps a late answer from being a failed attempt sent again (at least once, rightly)."""
    subscribe(conn, receiver.url, events=["invoice.create"])
    async with running_worker(db_url, concurrency=32, delivery_timeout=30.0), \
            running_worker(db_url, concurrency=32, delivery_timeout=30.0):
        started = time.monotonic()
        for batch in range(20):
            await asyncio.to_thread(
                conn.execute, "INSERT INTO invoices (number, customer, amount)"
                " SELECT 'N' || (%s * 100 + g), 'c', 1 FROM generate_series(0, 99) g",
                (batch,))
        await receiver.wait_for(lambda r: len(r.deliveries()) >= 2000, timeout=60)
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.2)  # a duplicate, if any, would arrive now
    ids = [r.headers["webhook-id"] for r in receiver.deliveries()]
    again = conn.execute(
        "SELECT d.id, d.attempts, array_agg(a.error ORDER BY a.attempt)"
        "  FROM webhooks.deliveries d LEFT JOIN webhooks.attempts a ON a.delivery_id = d.id"
        " WHERE d.attempts <> 1 GROUP BY d.id, d.attempts ORDER BY d.id LIMIT 10").fetchall()
    assert len(ids) == 2000 and len(set(ids)) == 2000, (
        f"{len(ids)} POSTs of {len(set(ids))} webhook-ids for 2,000 deliveries;"
        f" deliveries attempted other than once (id, attempts, errors): {again}")
    counts = conn.execute("SELECT status, count(*) FROM webhooks.deliveries GROUP BY 1"
                          ).fetchall()
    assert counts == [("succeeded", 2000)]
    print(f"\n2,000 deliveries by two workers in {elapsed:.2f}s "
          f"({2000 / elapsed:.0f}/s)")


async def test_a_fanout_lock_held_by_a_connection_gone_quiet_is_taken_back(
        db_url: str, conn: psycopg.Connection, receiver: Receiver,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that holds the fan-out's lock and waits for a client that is gone (a
    worker killed behind a proxy that keeps its connection open) would stop every worker's
    fan-out: after STUCK_FANOUT seconds locked out, a worker ends it."""
    monkeypatch.setattr(outbox, "STUCK_FANOUT", 1.0)
    subscribe(conn, receiver.url, events=["invoice.create"])
    holder = psycopg.connect(db_url)  # a transaction, left idle with the lock
    try:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (FANOUT_LOCK,))
        async with running_worker(db_url):
            add_invoice(conn, "STUCK")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1, timeout=20)
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                           (holder.info.backend_pid,)).fetchone()
        assert row == (0,), "the lock's holder was not ended"
    finally:
        holder.close()


async def test_killed_worker_loses_nothing(db_url: str, conn: psycopg.Connection,
                                           receiver: Receiver, tmp_path: Path) -> None:
    async def slow(req: Received) -> web.StreamResponse:
        await asyncio.sleep(0.02)
        return web.Response(status=200)

    receiver.behaviour = slow
    subscribe(conn, receiver.url, events=["invoice.create"])
    proc = await start_worker_process(db_url, tmp_path / "worker.log",
                                      WEBHOOKS_LEASE="2", WEBHOOKS_DELIVERY_TIMEOUT="1")
    try:
        conn.execute("INSERT INTO invoices (number, customer, amount)"
                     " SELECT 'K' || g, 'c', 1 FROM generate_series(1, 300) g")
        await receiver.wait_for(lambda r: len(r.deliveries()) >= 40, timeout=20)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert len(distinct_ids(receiver)) < 300, "the worker finished before it was killed"
    async with running_worker(db_url):
        await receiver.wait_for(lambda r: len(distinct_ids(r)) == 300, timeout=30)
        await wait_until(lambda: conn.execute(
            "SELECT count(*) FROM webhooks.deliveries WHERE status = 'succeeded'"
        ).fetchone() == (300,), what="all deliveries succeeded")


async def test_sigterm_finishes_in_flight_and_exits_zero(
        db_url: str, conn: psycopg.Connection, receiver: Receiver, tmp_path: Path) -> None:
    async def slow(req: Received) -> web.StreamResponse:
        await asyncio.sleep(0.5)
        return web.Response(status=200)

    receiver.behaviour = slow
    subscribe(conn, receiver.url, events=["invoice.create"])
    proc = await start_worker_process(db_url, tmp_path / "worker.log")
    try:
        await wait_until(lambda: listener_pids(conn), what="worker listening")
        add_invoice(conn, "TERM")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # The attempt in flight at SIGTERM was allowed to finish and was recorded.
    assert conn.execute("SELECT status FROM webhooks.deliveries").fetchall() == [
        ("succeeded",)]
    assert not listener_pids(conn)


async def test_reconnects_after_connections_are_terminated(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    subscribe(conn, receiver.url, events=["invoice.create"])
    # A long poll: only a notification can deliver quickly.
    async with running_worker(db_url, poll_interval=30.0) as worker:
        add_invoice(conn, "BEFORE")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                     " AND application_name LIKE 'webhooks-%%'")
        await wait_until(lambda: listen_connections(worker) >= 2, what="listener back")
        await worker.listener.connected.wait()
        started = time.monotonic()
        add_invoice(conn, "AFTER")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 2, timeout=10)
        assert time.monotonic() - started < 5  # woken by NOTIFY, not the 30 s poll


async def test_stop_releases_what_cannot_finish(db_url: str, conn: psycopg.Connection,
                                                receiver: Receiver) -> None:
    release = asyncio.Event()

    async def hang(req: Received) -> web.StreamResponse:
        await release.wait()
        return web.Response(status=200)

    receiver.behaviour = hang
    subscribe(conn, receiver.url, events=["invoice.create"])
    settings = make_settings(db_url, shutdown_grace=0.2, delivery_timeout=20.0, lease=60.0)
    try:
        async with open_worker(settings, concurrency=4) as worker:
            add_invoice(conn, "STUCK")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
        assert metric(worker, "webhooks_worker_deliveries_released_total") == 1
    finally:
        release.set()
    row = conn.execute("SELECT status, attempts, lease_expires_at IS NULL,"
                       " next_attempt_at <= now() FROM webhooks.deliveries").fetchone()
    assert row == ("pending", 0, True, True)
