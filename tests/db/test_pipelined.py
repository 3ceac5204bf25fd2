"""The fan-out and the claim in one round trip (Store.fanout_and_claim): the claim takes what
the fan-out just made, and a failure in either commits neither, leaving the outbox as it
was (a burst's partitions analysed by a running worker: tests/e2e/test_pipelined.py)."""

from __future__ import annotations

from typing import cast

import psycopg
import pytest

from service.store import Store, StoreRejected
from service.store.worker import ClaimParams
from service.worker import delivery, pacing
from service.worker.delivery import Claim
from service.worker.fanout import FanoutBatch, fanout_params
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, open_pool


def claim_params(limit: int = 10) -> ClaimParams:
    """The parameters of a claim of up to `limit` deliveries, 8 per target, none in
    flight."""
    return pacing.claim_params(limit=limit, per_target=8, busy={}, lease=60.0, scan=100)


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


async def test_a_failure_in_either_commits_neither(db_url: str,
                                                   conn: psycopg.Connection) -> None:
    subscribe(conn, "http://t.example/", events=["invoice.create"])
    add_invoice(conn, "P-1")
    bad = cast(ClaimParams, {**claim_params(), "lease": "not a number"})
    async with open_pool(db_url) as pool:
        with pytest.raises(StoreRejected):
            await Store(pool).fanout_and_claim(
                FanoutBatch, Claim, fanout=fanout_params(100, 1 << 20), claim=bad)
    assert conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries").fetchone() == (0,)
