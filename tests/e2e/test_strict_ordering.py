"""Strict ordering: one delivery in flight at a time across every
worker, in event order, a failing delivery holding the later ones; unordered
subscriptions beside it keep their concurrency."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from aiohttp import web

from tests.support.receivers import Received, Receiver, echo_secret, status
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, poll, running_worker, worker_env


def event_ids(received: list[Received]) -> list[int]:
    return [json.loads(r.body)["event"]["id"] for r in received if r.body]


def strict(conn: psycopg.Connection, target: str) -> int:
    sid, _ = subscribe(conn, target, events=["invoice.create"])
    conn.execute("UPDATE webhooks.subscriptions SET ordering = 'strict' WHERE id = %s", (sid,))
    return sid


async def test_a_failing_delivery_holds_the_later_ones(db_url: str,
                                                       conn: psycopg.Connection) -> None:
    answers = iter([503, 503, 200] + [200] * 10)

    async def flaky(req: Received) -> web.StreamResponse:
        return await status(next(answers))(req)

    async with Receiver(behaviour=flaky) as receiver:
        strict(conn, receiver.url)
        async with running_worker(db_url, retry_schedule=(0.2, 0.2, 0.2, 0.2)):
            for n in range(5):
                add_invoice(conn, f"S-{n}")
            await poll(lambda: conn.execute(
                "SELECT count(*) FROM webhooks.deliveries WHERE status = 'succeeded'"
            ).fetchone() == (5,), what="five deliveries")
        ids = event_ids(receiver.deliveries())
    # The first is tried three times; nothing after it went out meanwhile.
    assert ids[:3] == [ids[0]] * 3
    assert ids[2:] == sorted(ids[2:]) and len(set(ids)) == 5


async def test_one_in_flight_while_unordered_ones_run_in_parallel(
        db_url: str, conn: psycopg.Connection) -> None:
    in_flight = {"strict": 0, "strict_max": 0, "other": 0, "other_max": 0}

    def counting(kind: str) -> object:
        async def handle(req: Received) -> web.StreamResponse:
            in_flight[kind] += 1
            in_flight[f"{kind}_max"] = max(in_flight[f"{kind}_max"], in_flight[kind])
            await asyncio.sleep(0.02)
            in_flight[kind] -= 1
            return await echo_secret(req)
        return handle

    async with Receiver(behaviour=counting("strict")) as ordered, \
            Receiver(behaviour=counting("other")) as unordered:
        strict(conn, ordered.url)
        subscribe(conn, unordered.url, events=["invoice.create"])
        async with running_worker(db_url):
            conn.execute("INSERT INTO invoices (number, customer, amount)"
                         " SELECT 'P-' || i, 'c', 1 FROM generate_series(1, 40) i")
            await poll(lambda: len(ordered.deliveries()) == 40
                       and len(unordered.deliveries()) == 40, timeout=30, what="80 receipts")
        assert event_ids(ordered.deliveries()) == sorted(event_ids(ordered.deliveries()))
    assert in_flight["strict_max"] == 1
    assert in_flight["other_max"] > 1


@pytest.fixture
def workers(db_url: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def start(db_url: str) -> subprocess.Popen[bytes]:
    env = worker_env(db_url, WEBHOOKS_LEASE="2", WEBHOOKS_LOG_LEVEL="WARNING",
                     WEBHOOKS_DELIVERY_TIMEOUT="1")
    return subprocess.Popen([sys.executable, "-m", "service", "worker"], env=env,
                            start_new_session=True)


@pytest.mark.timeout(180)
async def test_two_workers_killed_at_random_keep_event_order(
        db_url: str, conn: psycopg.Connection,
        workers: list[subprocess.Popen[bytes]]) -> None:
    """Two worker processes, one killed (SIGKILL) at a random moment and restarted after
    each burst of 25 events (150 in all): the strict subscription's receipts are in event
    order (a delivery cut off mid-flight may come again, never after a later one), every
    event arrives, and the unordered one beside it gets everything too."""
    rng = random.Random(15)

    async def slowish(req: Received) -> web.StreamResponse:
        await asyncio.sleep(rng.random() * 0.01)
        return await echo_secret(req)

    async with Receiver(behaviour=slowish) as ordered, Receiver() as unordered:
        strict(conn, ordered.url)
        subscribe(conn, unordered.url, events=["invoice.create"])
        workers.extend([start(db_url), start(db_url)])
        for burst in range(6):
            conn.execute("INSERT INTO invoices (number, customer, amount)"
                         " SELECT %s || i, 'c', 1 FROM generate_series(1, 25) i",
                         (f"K{burst}-",))
            await poll(lambda: len(ordered.deliveries()) > 0, what="deliveries under way")
            await asyncio.sleep(rng.random() * 0.3)  # a random moment to kill at
            victim = workers.pop(rng.randrange(len(workers)))
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
            workers.append(start(db_url))
        await poll(lambda: len(set(event_ids(ordered.deliveries()))) == 150
                   and len(set(event_ids(unordered.deliveries()))) == 150,
                   timeout=120, what="every event at both targets")
        ids = event_ids(ordered.deliveries())
    assert all(a <= b for a, b in itertools.pairwise(ids)), ids
