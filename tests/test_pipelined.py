"""The fan-out and the claim in one round trip (Store.pipelined): the claim takes what the
fan-out just made, and a failure leaves the outbox as it was."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.rows import class_row

from service.store import Store, StoreRejected
from service.worker import delivery
from service.worker.delivery import Claim
from service.worker.fanout import FanoutBatch, fanout_params
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, open_pool


def claim_params(limit: int = 10) -> dict[str, object]:
    return delivery.claim_params(limit=limit, per_target=8, busy={}, lease=60.0, scan=100)


async def test_the_claim_takes_the_deliveries_the_fan_out_made(
        db_url: str, conn: psycopg.Connection) -> None:
    sid = subscribe(conn, "http://t.example/", events=["invoice.create"])[0]
    add_invoice(conn, "P-1")
    add_invoice(conn, "P-2")
    async with open_pool(db_url) as pool:
        batches, rows = await Store(pool).pipelined(
            ("fanout", fanout_params(100, 1 << 20), class_row(FanoutBatch)),
            ("claim", claim_params(), class_row(Claim)))
    assert [(b.locked, b.taken, b.created) for b in batches] == [(True, 2, 2)]
    claims = delivery.in_start_order(rows)
    assert [c.subscription_id for c in claims] == [sid, sid]
    assert claims[0].id < claims[1].id
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries WHERE attempts = 1"
                        " AND lease_expires_at IS NOT NULL").fetchone() == (2,)


async def test_a_failure_in_either_commits_neither(db_url: str,
                                                   conn: psycopg.Connection) -> None:
    subscribe(conn, "http://t.example/", events=["invoice.create"])
    add_invoice(conn, "P-1")
    bad = {**claim_params(), "lease": "not a number"}
    async with open_pool(db_url) as pool:
        with pytest.raises(StoreRejected):
            await Store(pool).pipelined(
                ("fanout", fanout_params(100, 1 << 20), class_row(FanoutBatch)),
                ("claim", bad, class_row(Claim)))
    assert conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries").fetchone() == (0,)
