"""The wakeup rows: an idle worker asks for NOTIFY, a busy one stops asking, none linger."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg

from service.worker.loop import Worker
from service.worker.wakeup import Step
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, poll, running_worker


def disarms(worker: Worker) -> list[Step]:
    """The DISARM steps the worker's fan-outs take from now on (Wakeup.after_fanout)."""
    steps: list[Step] = []
    after_fanout = worker.wakeup.after_fanout

    async def counting(*args: Any, **kwargs: Any) -> Step:
        step = await after_fanout(*args, **kwargs)
        if step is Step.DISARM:
            steps.append(step)
        return step

    worker.wakeup.after_fanout = counting  # type: ignore[method-assign]
    return steps


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
            disarmed = disarms(worker)
            # A light load keeps the worker armed: one statement per fan-out.
            add_invoice(conn, "LIGHT")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1, timeout=10)
            assert disarmed == []
            # 30 statements at one commit fill a fan-out batch of 10: a backlog.
            with conn.transaction():
                for i in range(30):
                    add_invoice(conn, f"B-{i}")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 31, timeout=10)
            assert disarmed
            # With nobody armed no NOTIFY is sent; the worker's 50 ms checks still find these.
            add_invoice(conn, "AFTER")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 32, timeout=10)


async def test_a_steady_load_after_a_backlog_arms_the_worker_again(
        db_url: str, conn: psycopg.Connection) -> None:
    """Under a steady load the outbox is never empty when the worker looks (there are a
    few dozen statements for every 50 ms check); once a backlog has disarmed it, the
    worker must still go back to NOTIFY, not stay at polling speed while the load lasts."""
    batch = 400
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        async with running_worker(db_url, poll_interval=30.0, batch_size=batch) as worker:
            await poll(lambda: wakeup_pids(conn) == [worker.listener.pid])
            disarmed = disarms(worker)
            stop = threading.Event()
            written = [0, 0]

            def steady(n: int) -> None:
                # 250 commits/s each, never stopping while the test looks: a few dozen
                # statements for every 50 ms check, however fast the machine writes.
                with psycopg.connect(db_url, autocommit=True) as writer:
                    writer.execute("SET synchronous_commit = off")
                    start = time.monotonic()
                    while not stop.wait(max(0.0, start + written[n] / 250 - time.monotonic())):
                        add_invoice(writer, f"S{n}-{written[n]}")
                        written[n] += 1

            threads = [threading.Thread(target=steady, args=(n,)) for n in range(2)]
            for t in threads:
                t.start()
            try:
                await poll(lambda: min(written) > 20, what="the steady load")
                # One transaction of three batches' worth of statements: a backlog.
                conn.execute("DO $$ BEGIN FOR i IN 1..%s LOOP INSERT INTO invoices "
                             "(number, customer, amount) VALUES ('B-' || i, 'c', 1); "
                             "END LOOP; END $$" % (3 * batch))
                await poll(lambda: bool(disarmed), what="the backlog disarming")
                await poll(lambda: wakeup_pids(conn) == [worker.listener.pid], timeout=10,
                           what="the worker armed again under a steady load")
                assert all(t.is_alive() for t in threads)  # the load still runs
            finally:
                stop.set()
                for t in threads:
                    t.join()
            assert len(receiver.deliveries()) > 0
