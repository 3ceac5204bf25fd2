"""Rate limits through the API and a running worker: `rate_limit` on create and PUT, shown
in the subscription, and deliveries to the target kept to it."""

from __future__ import annotations

import time

import psycopg

from tests.support.api import api_for, assert_error
from tests.support.worker import add_invoice, running_worker


async def test_the_worker_keeps_to_the_rate_and_the_api_shows_it(db_url: str) -> None:
    async with api_for(db_url) as api:
        created = await api.request("POST", "/api/v1/webhooks/", json={
            "resource": "invoices", "events": "invoice.create", "target": api.receiver.url,
            "rate_limit": 20})
        assert created.status_code == 201, created.text
        sub = created.json()
        assert sub["rate_limit"] == 20
        path = f"/api/v1/webhooks/{sub['id']}"
        for bad in (0, 10_001, 2.5, "20", True):
            assert_error(await api.request("PUT", path, json={"rate_limit": bad}), 400,
                         "rate_limit")
        assert (await api.request("GET", path)).json()["rate_limit"] == 20
        # A PUT that leaves rate_limit out keeps it.
        kept = await api.request("PUT", path, json={"active": True})
        assert kept.status_code == 200 and kept.json()["rate_limit"] == 20, kept.text
        with psycopg.connect(db_url, autocommit=True) as conn:
            for n in range(40):
                add_invoice(conn, f"INV-RATE-{n}")
        start = time.monotonic()
        async with running_worker(db_url):
            await api.receiver.wait_for(lambda r: len(r.deliveries()) == 40, timeout=20)
        arrived = [r.at - start for r in api.receiver.deliveries()]
        first = min(arrived)
        # 20 a second with a burst of 10: 40 take about 1.5 s at least.
        assert sum(1 for at in arrived if at - first < 1.0) <= 31, arrived
        assert max(arrived) - first >= 1.2, arrived
        changed = await api.request("PUT", path, json={"rate_limit": None})
        # No limit: the field is left out, as for every subscription made without one.
        assert changed.status_code == 200 and "rate_limit" not in changed.json()
