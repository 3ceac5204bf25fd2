"""Adaptive per-target concurrency against real receivers: a fast target gets more in
flight than a slow one, and a lone owner whose targets answer fast is not held to half
of the worker's slots (tests/e2e/test_owner_caps.py keeps the isolation side)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import psycopg
from aiohttp import web

from service.worker.window import INITIAL_WINDOW
from tests.support.receivers import Behaviour, Received, Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import running_worker


@dataclass
class Gauge:
    """Requests a receiver is answering at once: now and at most."""

    now: int = 0
    most: int = 0


def answering_after(seconds: float, gauge: Gauge) -> Behaviour:
    """A behaviour: the target takes `seconds` to answer 200 (its own latency)."""

    async def respond(req: Received) -> web.StreamResponse:
        gauge.now += 1
        gauge.most = max(gauge.most, gauge.now)
        try:
            await asyncio.sleep(seconds)
        finally:
            gauge.now -= 1
        return web.Response(status=200)

    return respond


def add_invoices(conn: psycopg.Connection, company: str, n: int) -> None:
    conn.execute("INSERT INTO invoices (number, customer, amount, company_id)"
                 " SELECT %s || g, 'c', 1, %s FROM generate_series(1, %s) g",
                 (company, company, n))


async def test_a_fast_target_gets_more_in_flight_than_a_slow_one(
        db_url: str, conn: psycopg.Connection) -> None:
    fast_gauge, slow_gauge = Gauge(), Gauge()
    async with Receiver(behaviour=answering_after(0.005, fast_gauge)) as fast, \
            Receiver(behaviour=answering_after(0.4, slow_gauge)) as slow:
        subscribe(conn, fast.url, events=["invoice.create"], tenant="fastco", owner="a")
        subscribe(conn, slow.url, events=["invoice.create"], tenant="slowco", owner="b")
        # delivery_timeout 2 s: answers over 250 ms (half the slow mark) never count as fast.
        async with running_worker(db_url, concurrency=64, per_target_concurrency=32,
                                  delivery_timeout=2.0):
            add_invoices(conn, "slowco", 40)
            add_invoices(conn, "fastco", 600)
            await fast.wait_for(lambda r: len(r.deliveries()) == 600, timeout=30)
            await slow.wait_for(lambda r: len(r.deliveries()) == 40, timeout=30)
    assert fast_gauge.most > INITIAL_WINDOW, fast_gauge
    assert fast_gauge.most <= 32
    # The slow target answers steadily: not held to its first window (it was, and a
    # target slower than the slow mark to one request at a time), but it grows by about
    # one per window of answers, where the fast one grows by one per answer (32 here,
    # about 7 for the slow one).
    assert INITIAL_WINDOW < slow_gauge.most < fast_gauge.most, (slow_gauge, fast_gauge)


async def test_a_lone_owner_with_fast_targets_is_not_halved(
        db_url: str, conn: psycopg.Connection) -> None:
    gauge = Gauge()
    async with Receiver(behaviour=answering_after(0.02, gauge)) as receiver:
        subscribe(conn, receiver.url, events=["invoice.create"], owner="alone")
        subscribe(conn, receiver.url + "/2", events=["invoice.create"], owner="alone")
        # Eight slots: half of them is the owner's share; alone it may use all but two.
        async with running_worker(db_url, concurrency=8, per_target_concurrency=8):
            add_invoices(conn, "acme", 150)
            await receiver.wait_for(lambda r: len(r.deliveries()) == 300, timeout=30)
    assert gauge.most == 6, gauge
