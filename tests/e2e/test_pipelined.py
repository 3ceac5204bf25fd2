"""A burst has the partitions it fills analysed: after a fan-out that made many deliveries
the worker analyses the partition being filled (the fan-out and the claim in one round
trip, Store.fanout_and_claim: tests/db/test_pipelined.py)."""

from __future__ import annotations

import psycopg
import pytest

from service.worker import upkeep
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import maintained, poll, running_worker


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
