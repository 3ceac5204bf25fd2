"""A quiet worker sends fresh changes without a claim: once a claim has found the queue
drained, the fan-out leases the deliveries it makes (the fanout query's `take`) and the
worker sends them, each once, in order. What the fan-out leases, and what it leaves to the
claim: tests/db/test_fanout_lease.py."""

from __future__ import annotations

import json

import psycopg

from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, metric, poll, running_worker


async def test_a_quiet_worker_sends_fresh_changes_without_a_claim(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    """Once a claim has found the queue drained, each change's delivery is made leased by
    the fan-out, sent once, in order, and recorded."""
    subscribe(conn, receiver.url, events=["invoice.create"])
    async with running_worker(db_url) as worker:
        for n in range(6):
            add_invoice(conn, f"W-{n}")
            await receiver.wait_for(lambda r, n=n: len(r.deliveries()) == n + 1)
            await poll(lambda: conn.execute(
                "SELECT count(*) FROM webhooks.deliveries WHERE status = 'pending'"
            ).fetchone() == (0,), what="the attempt recorded")
        assert metric(worker, "webhooks_worker_deliveries_leased_by_fanout_total") >= 3
    numbers = [json.loads(r.body)["resource"]["number"] for r in receiver.deliveries()]
    assert numbers == [f"W-{n}" for n in range(6)]
    assert conn.execute("SELECT count(*), sum(attempts) FROM webhooks.deliveries"
                        " WHERE status = 'succeeded'").fetchone() == (6, 6)
