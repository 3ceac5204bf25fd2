"""A quiet queue's fan-out leases what it makes (the fanout query's `take`): a fresh
change's delivery goes to the worker without a claim, in small batches only. That it
leases within the claim's caps, and never ahead of a delivery that was already due:
tests/db/test_fanout_lease.py."""

from __future__ import annotations

import json
from datetime import datetime

import psycopg

from service.worker import delivery
from tests.support.fanout import fan_out, lease, leased_rows
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, metric, poll, running_worker


async def test_a_quiet_queue_s_deliveries_come_back_leased(
        db_url: str, conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn, "http://t.example/hook", events=["invoice.create"])
    add_invoice(conn, "Q-1")
    add_invoice(conn, "Q-2")
    batch = await fan_out(db_url, lease())
    assert (batch.locked, batch.created, batch.quiet) == (True, 2, True)
    claims = delivery.in_start_order(delivery.leased(batch.claims))
    assert [(c.subscription_id, c.attempts, c.active, c.target) for c in claims] == [
        (sid, 1, True, "http://t.example/hook")] * 2
    assert claims[0].id < claims[1].id
    assert [json.loads(c.body)["resource"]["number"] for c in claims] == ["Q-1", "Q-2"]
    assert {c.event for c in claims} == {"invoice.create"}
    rows = conn.execute("SELECT id, created_at, attempts, status FROM webhooks.deliveries"
                        " ORDER BY id").fetchall()
    # The claim's partition key comes back exact: the recorder finds the row by it.
    assert [(c.id, c.created_at) for c in claims] == [(r[0], r[1]) for r in rows]
    assert all(isinstance(c.due, datetime) for c in claims)
    assert leased_rows(conn) == [(sid, 1), (sid, 1)]


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


async def test_only_a_small_batch_is_leased(db_url: str, conn: psycopg.Connection) -> None:
    """However much room the worker has, a batch of more than 64 deliveries is left to the
    claim: ranking and joining its rows would cost the large fan-outs."""
    subscribe(conn, "http://t.example/", events=["invoice.create"])
    conn.execute("INSERT INTO invoices (number, customer, amount, company_id)"
                 " SELECT 'S-' || g, 'c', 1, 'acme' FROM generate_series(1, 65) g")
    batch = await fan_out(db_url, lease(limit=1000, per_target=1000))
    assert (batch.created, batch.quiet, batch.claims) == (65, True, None)
    conn.execute("DELETE FROM webhooks.deliveries")
    conn.execute("INSERT INTO invoices (number, customer, amount, company_id)"
                 " SELECT 'T-' || g, 'c', 1, 'acme' FROM generate_series(1, 64) g")
    batch = await fan_out(db_url, lease(limit=1000, per_target=1000))
    assert (batch.created, len(delivery.leased(batch.claims))) == (64, 64)
