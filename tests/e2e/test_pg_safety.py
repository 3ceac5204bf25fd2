"""Postgres-side faults: statement timeouts, an idle LISTEN connection, capture with no
service running."""

from __future__ import annotations

from urllib.parse import quote

import psycopg

from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, metric, numbers, poll, running_worker


async def test_worker_survives_statement_timeout(db_url: str, conn: psycopg.Connection
                                                 ) -> None:
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        add_invoice(conn, "ST-1")
        # The worker's own sessions cancel any statement after 300 ms.
        url = db_url + "?options=" + quote("-c statement_timeout=300")
        with psycopg.connect(db_url) as locker:
            locker.execute("LOCK TABLE webhooks.outbox IN ACCESS EXCLUSIVE MODE")
            async with running_worker(url) as worker:
                await poll(lambda: metric(worker, "webhooks_worker_db_errors_total") >= 1,
                           what="a cancelled statement")
                assert receiver.deliveries() == []
                locker.rollback()  # the lock goes; the worker's next try gets through
                await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
        assert numbers(receiver.deliveries()) == ["ST-1"]


async def test_listen_connection_never_holds_a_transaction(db_url: str,
                                                           conn: psycopg.Connection) -> None:
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        async with running_worker(db_url):
            for i in range(20):
                add_invoice(conn, f"L-{i}")
                states = [r[0] for r in conn.execute(
                    "SELECT state FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query ILIKE 'LISTEN%'")]
                assert states and all(s == "idle" for s in states), states
            await receiver.wait_for(lambda r: len(r.deliveries()) == 20)


async def test_capture_goes_on_while_the_service_is_down_and_drains_after(
        db_url: str, conn: psycopg.Connection) -> None:
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        for i in range(50):
            add_invoice(conn, f"D-{i}")
        backlog = conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone()
        assert backlog == (50,)
        async with running_worker(db_url, per_target_concurrency=1):
            await receiver.wait_for(lambda r: len(r.deliveries()) == 50)
        assert numbers(receiver.deliveries()) == [f"D-{i}" for i in range(50)]
        assert conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone() == (0,)
