"""What the worker does with each answer: retries, 410, Retry-After, slow targets, order."""

from __future__ import annotations

import asyncio
import time

import psycopg
from aiohttp import web

from tests.support.receivers import Behaviour, Received, Receiver, hanging_receiver, status
from tests.support.subscriptions import subscribe, subscription
from tests.support.worker import add_invoice, numbers, poll, running_worker


def failing_then_ok(failures: int, code: int = 500) -> Behaviour:
    """Answers `code` (with a body naming the try) `failures` times, then 200."""
    count = 0

    async def respond(req: Received) -> web.StreamResponse:
        nonlocal count
        count += 1
        if count <= failures:
            return web.Response(status=code, text=f"boom {count}")
        return web.Response(status=200)

    return respond


def attempts_of(conn: psycopg.Connection) -> list[tuple[int, int]]:
    return conn.execute("SELECT attempt, status FROM webhooks.attempts ORDER BY id").fetchall()


async def test_failures_are_retried_with_the_same_id(db_url: str, conn: psycopg.Connection,
                                                     receiver: Receiver) -> None:
    receiver.behaviour = failing_then_ok(2)
    sid, _ = subscribe(conn, receiver.url)
    async with running_worker(db_url):
        add_invoice(conn, "RETRY")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 3)
        deadline = time.monotonic() + 5
        while conn.execute("SELECT status FROM webhooks.deliveries").fetchone() != (
                "succeeded",):
            assert time.monotonic() < deadline, "delivery not recorded as succeeded"
            await asyncio.sleep(0.02)
    ids = {r.headers["webhook-id"] for r in receiver.deliveries()}
    assert len(ids) == 1
    assert attempts_of(conn) == [(1, 500), (2, 500), (3, 200)]
    sub = subscription(conn, sid)
    assert sub["last_status"] == 200
    assert sub["last_success_at"] is not None and sub["last_failure_at"] is not None
    assert sub["last_failure_at"] < sub["last_success_at"]
    assert sub["last_failure_content"] == "boom 2"


async def test_schedule_exhausted_marks_failed(db_url: str, conn: psycopg.Connection,
                                               receiver: Receiver) -> None:
    receiver.behaviour = status(500, body="nope " * 500)
    sid, secret = subscribe(conn, receiver.url)
    async with running_worker(db_url):
        add_invoice(conn, "DOOMED")
        deadline = time.monotonic() + 10
        while conn.execute("SELECT status FROM webhooks.deliveries").fetchone() != ("failed",):
            assert time.monotonic() < deadline, "delivery never marked failed"
            await asyncio.sleep(0.02)
    # One try plus one per step of the three-step schedule, then kept for inspection.
    assert len(receiver.deliveries()) == 4
    assert attempts_of(conn) == [(1, 500), (2, 500), (3, 500), (4, 500)]
    sub = subscription(conn, sid)
    assert sub["last_status"] == 500 and sub["last_success_at"] is None
    assert sub["last_failure_content"].startswith("nope ")
    assert len(sub["last_failure_content"].encode()) <= 1024
    assert secret not in sub["last_failure_content"]


async def test_no_response_records_status_zero(db_url: str, conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn, "http://127.0.0.1:9/refused")
    async with running_worker(db_url, retry_schedule=(60.0,)):
        add_invoice(conn, "NOBODY")
        deadline = time.monotonic() + 10
        while not conn.execute("SELECT count(*) FROM webhooks.attempts").fetchone()[0]:
            assert time.monotonic() < deadline, "no attempt recorded"
            await asyncio.sleep(0.02)
    sub = subscription(conn, sid)
    assert sub["last_status"] == 0
    assert sub["last_failure_content"]
    row = conn.execute("SELECT status, attempts FROM webhooks.deliveries").fetchone()
    assert row == ("pending", 1)


async def test_gone_deactivates_and_stops(db_url: str, conn: psycopg.Connection,
                                          receiver: Receiver) -> None:
    receiver.behaviour = status(410)
    async with Receiver() as healthy:
        sid, _ = subscribe(conn, receiver.url)
        subscribe(conn, healthy.url)
        for n in range(3):
            add_invoice(conn, f"G{n}")
        async with running_worker(db_url, per_target_concurrency=1):
            await healthy.wait_for(lambda r: len(r.deliveries()) == 3)
            deadline = time.monotonic() + 5
            while subscription(conn, sid)["active"]:
                assert time.monotonic() < deadline, "subscription still active"
                await asyncio.sleep(0.02)
            add_invoice(conn, "AFTER")
            await healthy.wait_for(lambda r: len(r.deliveries()) == 4)
            gone_requests = len(receiver.deliveries())
        assert 1 <= gone_requests <= 3
        assert all(b"AFTER" not in r.body for r in receiver.deliveries())
        sub = subscription(conn, sid)
        assert sub["last_status"] == 410
        rows = conn.execute("SELECT DISTINCT status FROM webhooks.deliveries"
                            " WHERE subscription_id = %s", (sid,)).fetchall()
        assert rows == [("failed",)]


async def test_retry_after_is_honoured(db_url: str, conn: psycopg.Connection,
                                       receiver: Receiver) -> None:
    calls = 0

    async def busy_once(req: Received) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            return web.Response(status=503, headers={"Retry-After": "1"})
        return web.Response(status=200)

    receiver.behaviour = busy_once
    subscribe(conn, receiver.url)
    async with running_worker(db_url):
        add_invoice(conn, "LATER")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 2)
    first, second = receiver.deliveries()
    # The schedule says 50 ms; the target asked for a second.
    assert second.at - first.at >= 0.9


async def test_hanging_target_does_not_delay_a_healthy_one(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    async with hanging_receiver() as (hanging, release):
        # Two owners: one owner's subscriptions share a cap too (tests/e2e/test_owner_caps.py).
        subscribe(conn, hanging.url, owner="hanging")
        subscribe(conn, receiver.url, owner="healthy")
        async with running_worker(db_url, concurrency=4, per_target_concurrency=2,
                                  delivery_timeout=10.0):
            started = time.monotonic()
            for n in range(20):
                add_invoice(conn, f"H{n}")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 20, timeout=5)
            elapsed = time.monotonic() - started
            assert len(hanging.received) == 2  # its cap, and not one more
            release.set()
            await hanging.wait_for(lambda r: len(r.deliveries()) == 20)
        assert elapsed < 3  # far below the 10 s the hanging target holds its slots
        assert sorted(numbers(receiver.deliveries())) == sorted(f"H{n}" for n in range(20))


async def test_healthy_subscription_gets_events_in_order(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    subscribe(conn, receiver.url)
    with conn.transaction():
        for n in range(30):
            add_invoice(conn, f"A{n:02}")
    async with running_worker(db_url, per_target_concurrency=1):
        for n in range(30):
            add_invoice(conn, f"B{n:02}")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 60)
    expected = [f"A{n:02}" for n in range(30)] + [f"B{n:02}" for n in range(30)]
    assert numbers(receiver.deliveries()) == expected


async def test_many_hanging_targets_hold_one_slot_each_once_they_time_out(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    async with hanging_receiver() as (hanging, _):
        # Four hanging subscriptions (of four owners, each under its owner's cap of 4) at
        # a cap of 2 could fill all 8 slots.
        for n in range(4):
            subscribe(conn, hanging.url, owner=f"hanging-{n}")
        subscribe(conn, receiver.url, owner="healthy")
        async with running_worker(db_url, concurrency=8, per_target_concurrency=2,
                                  delivery_timeout=0.5, retry_schedule=(0.05,) * 20):
            for n in range(5):
                add_invoice(conn, f"W{n}")
            # Their first attempts time out: from then on each holds one slot, not two.
            await poll(lambda: len(hanging.received) >= 8, what="first attempts")
            await asyncio.sleep(0)
            started = time.monotonic()
            for n in range(40):
                add_invoice(conn, f"K{n}")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 45, timeout=10)
            elapsed = time.monotonic() - started
        # With every slot held by hanging targets, 40 deliveries would take 40 timeouts of
        # 0.5 s spread over the slots that free up; with one slot each there are 4 left.
        assert elapsed < 4.0
