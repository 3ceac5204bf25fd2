"""The fan-out and the claim in one round trip (Store.fanout_and_claim): a failure in
either commits neither, and leaves the outbox as it was (the claim taking what the
fan-out just made: tests/e2e/test_pipelined.py)."""

from __future__ import annotations

from typing import cast

import psycopg
import pytest

from service.store import Store, StoreRejected
from service.store.worker import ClaimParams
from service.worker.delivery import Claim
from service.worker.fanout import FanoutBatch, fanout_params
from tests.support.claims import claim_params
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, open_pool


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
