"""Activations that wait for a long application transaction hold no pooled connection:
while a dozen re-activations of one owner wait for a writer, another owner's requests are
served at once, and the wait still gives the documented start ("A subscription starts
when ...")."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import psycopg

from tests.support.api import api_for
from tests.support.subscriptions import subscribe

WAITING = 12


async def until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.02)


def settling_backends(conn: psycopg.Connection) -> int:
    """Backends of the API that sit in a settle query right now."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state = 'active' AND query LIKE '%%settle_%%' AND pid <> pg_backend_pid()"
    ).fetchone()
    assert row is not None
    return int(row[0])


async def test_waiting_activations_leave_the_pool_to_other_owners(db_url: str) -> None:
    async with api_for(db_url, verify_timeout=60.0, pool_size=4) as api:
        with psycopg.connect(db_url, autocommit=True) as conn:
            paused = [subscribe(conn, api.receiver.url, owner="alice", active=False)[0]
                      for _ in range(WAITING)]
            bob = api.new_token("bob")
            await api.create(token=bob)
            with psycopg.connect(db_url) as writer:
                # An application transaction that wrote to the resource and stays open: its
                # capture probe ran before any of the subscriptions could be seen.
                writer.execute("INSERT INTO invoices (number, customer, amount)"
                               " VALUES ('open', 'c', 1)")
                (xid,) = writer.execute("SELECT pg_current_xact_id()::text").fetchone() or ("",)
                puts = [asyncio.create_task(api.request(
                    "PUT", f"/api/v1/webhooks/{sid}", json={"active": True}))
                    for sid in paused]

                def all_active() -> bool:
                    row = conn.execute("SELECT count(*) FROM webhooks.subscriptions"
                                       " WHERE id = ANY (%s) AND active", (paused,)).fetchone()
                    return row is not None and row[0] == WAITING

                await until(all_active, 20, "the re-activations committed")
                # Every activation now waits for the writer; none holds a connection while
                # it does, so bob's requests take one from the pool and are answered.
                for _ in range(5):
                    assert settling_backends(conn) < 4
                    listed = await asyncio.wait_for(
                        api.request("GET", "/api/v1/webhooks/", token=bob), 10)
                    assert listed.status_code == 200 and len(listed.json()) == 1
                # (Another resource: an invoice subscription would wait for the writer too.)
                created = await asyncio.wait_for(api.create(
                    token=bob, resource="webhooks", events="webhook.failing"), 10)
                assert created["active"] is True
                assert not any(p.done() for p in puts), "an activation stopped waiting"
                writer.commit()
            answers: list[httpx.Response] = await asyncio.wait_for(asyncio.gather(*puts), 20)
            assert [a.status_code for a in answers] == [200] * WAITING
            # Each started after the writer ended: its changes count as before them all.
            rows = conn.execute(
                "SELECT count(*) FROM webhooks.subscriptions WHERE id = ANY (%s)"
                " AND pg_visible_in_snapshot(%s::xid8, active_since)", (paused, xid)
            ).fetchone()
            assert rows == (WAITING,)
