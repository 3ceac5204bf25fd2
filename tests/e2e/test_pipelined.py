"""The fan-out and the claim in one round trip (Store.fanout_and_claim): the claim takes what the
fan-out just made, and a burst has the partitions it fills analysed (that a failure
leaves the outbox as it was: tests/db/test_pipelined.py)."""

from __future__ import annotations

import psycopg
import pytest

from service.store import Store
from service.worker import delivery, upkeep
from service.worker.delivery import Claim
from service.worker.fanout import FanoutBatch, fanout_params
from tests.support.claims import claim_params
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, maintained, open_pool, poll, running_worker


async def test_the_claim_takes_the_deliveries_the_fan_out_made(
        db_url: str, conn: psycopg.Connection) -> None:
    sid = subscribe(conn, "http://t.example/", events=["invoice.create"])[0]
    add_invoice(conn, "P-1")
    add_invoice(conn, "P-2")
    async with open_pool(db_url) as pool:
        batches, rows = await Store(pool).fanout_and_claim(
            FanoutBatch, Claim, fanout=fanout_params(100, 1 << 20), claim=claim_params())
    assert [(b.locked, b.taken, b.created) for b in batches] == [(True, 2, 2)]
    claims = delivery.in_start_order(rows)
    assert [c.subscription_id for c in claims] == [sid, sid]
    assert claims[0].id < claims[1].id
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries WHERE attempts = 1"
                        " AND lease_expires_at IS NOT NULL").fetchone() == (2,)


async def test_a_burst_has_the_partitions_it_fills_analysed(
        db_url: str, conn: psycopg.Connection, receiver: Receiver,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After a fan-out that made many deliveries the worker analyses the partition being
    filled, so the claim's plan knows the due deliveries are many (autovacuum would look
    a minute later, at best)."""
    monkeypatch.setattr(upkeep, "ANALYZE_AFTER", 50)

    def analysed() -> int:
        return maintained(conn, "analyze_count")

    before = analysed()
    subscribe(conn, receiver.url, events=["invoice.create"])
    async with running_worker(db_url):
        conn.execute("INSERT INTO invoices (number, customer, amount, company_id)"
                     " SELECT 'B-' || i, 'c', 1, 'acme' FROM generate_series(1, 60) i")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 60)
        await poll(lambda: analysed() > before, what="the partition analysed")
