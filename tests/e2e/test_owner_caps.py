"""In-flight caps per owner: one owner's many hanging subscriptions cannot fill a worker
(the claim holding the cap: tests/db/test_delivery.py; the setting,
WEBHOOKS_PER_OWNER_CONCURRENCY: tests/unit/test_config.py)."""

from __future__ import annotations

import time

import psycopg

from tests.support.receivers import Receiver, hanging_receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, poll, running_worker


async def test_one_owners_hanging_subscriptions_leave_room_for_others(
        db_url: str, conn: psycopg.Connection) -> None:
    concurrency = 8
    async with hanging_receiver() as (hanging, release), Receiver() as healthy:
        for _ in range(12):
            subscribe(conn, hanging.url, events=["invoice.create"], owner="greedy")
        async with running_worker(db_url, concurrency=concurrency, per_target_concurrency=2,
                                  delivery_timeout=30.0, lease=60.0):
            for n in range(3):
                add_invoice(conn, f"G{n}")
            await hanging.wait_for(lambda r: len(r.received) >= concurrency // 2)
            subscribe(conn, healthy.url, events=["invoice.create"], owner="other")
            started = time.monotonic()
            for n in range(5):
                add_invoice(conn, f"O{n}")
            await healthy.wait_for(lambda r: len(r.deliveries()) == 5, timeout=10)
            elapsed = time.monotonic() - started
            # The default cap is half the worker's slots.
            assert len(hanging.received) == concurrency // 2
            release.set()
            await poll(lambda: len(hanging.received) == 12 * 8, timeout=20,
                       what="the greedy owner's deliveries, once its targets answer")
    assert elapsed < 5  # far below the 30 s the hanging targets hold their slots
