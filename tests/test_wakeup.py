"""The wakeup rows: an idle worker asks for NOTIFY, a busy one stops asking, none linger."""

from __future__ import annotations

import asyncio
import time

import psycopg

from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, poll, running_worker


def wakeup_pids(conn: psycopg.Connection) -> list[int]:
    return [r[0] for r in conn.execute("SELECT pid FROM webhooks.wakeups ORDER BY pid")]


async def test_idle_worker_arms_with_its_listener_pid_and_disarms_on_stop(
        db_url: str, conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO webhooks.wakeups (pid) VALUES (999999)")  # a dead connection
    async with running_worker(db_url) as worker:
        await poll(lambda: wakeup_pids(conn) == [worker.listener.pid])
        listening = conn.execute("SELECT count(*) FROM pg_stat_activity "
                                 "WHERE pid = %s AND query ILIKE 'LISTEN%%'",
                                 (worker.listener.pid,)).fetchone()
        assert listening == (1,)
    assert wakeup_pids(conn) == []


async def test_notified_delivery_is_fast_when_armed(db_url: str,
                                                    conn: psycopg.Connection) -> None:
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        # A long poll interval: only the notification can make this quick.
        async with running_worker(db_url, poll_interval=30.0) as worker:
            await poll(lambda: wakeup_pids(conn) == [worker.listener.pid])
            await asyncio.sleep(0)  # let the post-arming rechecks pass their first step
            started = time.monotonic()
            add_invoice(conn, "FAST-1")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1, timeout=5)
            assert time.monotonic() - started < 2.0


async def test_a_backlog_disarms_and_the_worker_keeps_polling(
        db_url: str, conn: psycopg.Connection) -> None:
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        async with running_worker(db_url, poll_interval=30.0, batch_size=10) as worker:
            await poll(lambda: wakeup_pids(conn) == [worker.listener.pid])
            # A light load keeps the worker armed: one statement per fan-out.
            add_invoice(conn, "LIGHT")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1, timeout=10)
            assert worker.stats.disarmed == 0
            # 30 statements at one commit fill a fan-out batch of 10: a backlog.
            with conn.transaction():
                for i in range(30):
                    add_invoice(conn, f"B-{i}")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 31, timeout=10)
            assert worker.stats.disarmed >= 1
            # With nobody armed no NOTIFY is sent; the worker's 50 ms checks still find these.
            add_invoice(conn, "AFTER")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 32, timeout=10)
