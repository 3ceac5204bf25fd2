"""The recorder lets a small batch gather for a moment (service/worker/recorder.py,
GATHER_FOR), except a strict subscription's outcome, whose record unparks the next
delivery, and at shutdown."""

from __future__ import annotations

import asyncio
import time

import psycopg
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from service.worker import delivery
from service.worker.delivery import Claim, Outcome
from service.worker.recorder import Recorder
from tests.support.claims import claim
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe
from tests.support.worker import make_settings, open_pool, poll


def succeeded(db_url: str, claims: list[Claim]) -> list[Outcome]:
    settings = make_settings(db_url)
    return [delivery.decide(c, settings, status=200, retry_after=None,
                            attempted_at=time.time(), duration_ms=1.0, error=None)
            for c in claims]


async def claimed(pool: AsyncConnectionPool, conn: psycopg.Connection, rows: int) -> list[Claim]:
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'G' || g, 'c', 1 FROM generate_series(1, %s) g", (rows,))
    store = Store(pool)
    await drain_outbox(store, 1000)
    return await claim(store, limit=100, per_target=100, busy={}, lease=60.0, scan=100)


async def written_alone(pool: AsyncConnectionPool, outcome: Outcome, *,
                        gather_for: float) -> None:
    """Gives a running recorder one outcome; returns once it is written (the test fails
    if that takes 10 s)."""
    recorder = Recorder(Store(pool), gather_for=gather_for)
    run = asyncio.create_task(recorder.run())
    try:
        recorder.add(outcome)
        await poll(lambda: recorder.recorded == 1, what="the outcome written")
    finally:
        run.cancel()


def recorded(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM webhooks.attempts").fetchone()
    assert row is not None
    return int(row[0])


async def test_outcomes_that_come_close_together_are_written_in_one_statement(
        db_url: str, conn: psycopg.Connection) -> None:
    subscribe(conn, "http://t.example/", events=["invoice.create"])
    async with open_pool(db_url) as pool:
        claims = await claimed(pool, conn, 2)
        assert [c.strict for c in claims] == [False, False]
        first, second = succeeded(db_url, claims)
        batches: list[int] = []
        # A window far longer than the test: only close() ends it here.
        recorder = Recorder(Store(pool), on_written=lambda b: batches.append(len(b)),
                            gather_for=30.0)
        run = asyncio.create_task(recorder.run())
        recorder.add(first)
        for _ in range(20):  # without the window, the first would be written alone now
            await asyncio.sleep(0)
        recorder.add(second)
        recorder.close()
        await asyncio.wait_for(run, 20)
    assert batches == [2]
    assert recorded(conn) == 2


async def test_a_small_batch_is_written_when_its_window_ends(
        db_url: str, conn: psycopg.Connection) -> None:
    subscribe(conn, "http://t.example/", events=["invoice.create"])
    async with open_pool(db_url) as pool:
        (claim,) = await claimed(pool, conn, 1)
        await written_alone(pool, succeeded(db_url, [claim])[0], gather_for=0.05)
    assert recorded(conn) == 1


async def test_a_strict_subscription_s_outcome_is_written_at_once(
        db_url: str, conn: psycopg.Connection) -> None:
    """Its record unparks the subscription's next delivery: it does not wait."""
    sid, _ = subscribe(conn, "http://t.example/", events=["invoice.create"])
    conn.execute("UPDATE webhooks.subscriptions SET ordering = 'strict' WHERE id = %s",
                 (sid,))
    async with open_pool(db_url) as pool:
        (head,) = await claimed(pool, conn, 2)  # the second waits, parked
        assert head.strict
        await written_alone(pool, succeeded(db_url, [head])[0], gather_for=30.0)
    # Recorded, and the next delivery came due (unparked).
    assert conn.execute(
        "SELECT count(*) FROM webhooks.deliveries WHERE status = 'pending'"
        " AND next_attempt_at <= now()").fetchone() == (1,)
