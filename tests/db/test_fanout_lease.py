"""A quiet queue's fan-out leases what it makes (the fanout query's `take`): its deliveries
come back leased, with their bodies and exact partition keys, but only where a claim would
take them: never ahead of a delivery that was already due, within the claim's caps, and
never a batch larger than the room or than 64 (a worker sending the leased deliveries
without a claim: tests/e2e/test_fanout_lease.py)."""

from __future__ import annotations

import json
from datetime import datetime

import psycopg

from service.store import Store
from service.store.worker import ClaimParams
from service.worker import delivery
from service.worker.fanout import FanoutBatch, fanout_params
from service.worker.pacing import claim_params
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, open_pool


def lease(limit: int = 10, per_target: int = 8, busy: dict[int, int] | None = None,
          degraded: tuple[int, ...] = (), per_owner: int | None = None,
          busy_owners: dict[str, int] | None = None) -> ClaimParams:
    """The claim's parameters a fan-out leases what it makes by (the fanout query's
    `take`)."""
    return claim_params(limit=limit, per_target=per_target, busy=busy or {}, lease=60.0,
                        scan=100, degraded=degraded, per_owner=per_owner,
                        busy_owners=busy_owners)


async def fan_out(db_url: str, claim: ClaimParams) -> FanoutBatch:
    """One fan-out batch, leasing by `claim`, on a pool of its own."""
    async with open_pool(db_url) as pool:
        batch = await Store(pool).fanout(FanoutBatch, fanout_params(100, 1 << 20, lease=claim))
    assert batch is not None
    return batch


def leased_rows(conn: psycopg.Connection) -> list[tuple[int, int]]:
    """(subscription_id, attempts) of the deliveries made leased, by id."""
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT subscription_id, attempts FROM webhooks.deliveries"
        " WHERE lease_expires_at > now() AND next_attempt_at = lease_expires_at"
        " ORDER BY id").fetchall()]


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


async def test_nothing_is_leased_while_another_delivery_is_due(
        db_url: str, conn: psycopg.Connection) -> None:
    """A due delivery (here: made by a fan-out that leased nothing) goes first: leasing
    the newer one would start it before the older one of the same subscription."""
    subscribe(conn, "http://t.example/", events=["invoice.create"])
    add_invoice(conn, "D-1")
    first = await fan_out(db_url, lease(limit=0))
    assert (first.created, first.quiet, first.claims) == (1, False, None)
    add_invoice(conn, "D-2")
    batch = await fan_out(db_url, lease())
    assert (batch.created, batch.quiet, batch.claims) == (1, False, None)
    assert leased_rows(conn) == []
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries WHERE attempts = 0"
                        " AND next_attempt_at <= now()").fetchone() == (2,)


async def test_the_claim_s_caps_hold_back_what_they_would_in_a_claim(
        db_url: str, conn: psycopg.Connection) -> None:
    full, _ = subscribe(conn, "http://full.example/", events=["invoice.create"])
    degraded, _ = subscribe(conn, "http://degraded.example/", events=["invoice.create"])
    strict, _ = subscribe(conn, "http://strict.example/", events=["invoice.create"])
    free, _ = subscribe(conn, "http://free.example/", events=["invoice.create"])
    other, _ = subscribe(conn, "http://other.example/", events=["invoice.create"],
                         owner="busy-owner")
    conn.execute("UPDATE webhooks.subscriptions SET ordering = 'strict' WHERE id = %s",
                 (strict,))
    add_invoice(conn, "C-1")
    add_invoice(conn, "C-2")
    batch = await fan_out(db_url, lease(
        per_target=2, busy={full: 1, degraded: 0}, degraded=(degraded,), per_owner=5,
        busy_owners={"busy-owner": 5}))
    assert (batch.created, batch.quiet) == (10, True)
    # `full` has room for one more, `degraded` for one, `free` for both; the strict
    # subscription is left to the claim, and the owner at its cap gets nothing.
    assert sorted(leased_rows(conn)) == sorted([(full, 1), (degraded, 1), (free, 1),
                                                (free, 1)])
    assert sorted(c.subscription_id for c in delivery.leased(batch.claims)) == sorted(
        [full, degraded, free, free])
    assert other not in {s for s, _ in leased_rows(conn)}


async def test_a_batch_larger_than_the_room_is_left_to_the_claim(
        db_url: str, conn: psycopg.Connection) -> None:
    subscribe(conn, "http://t.example/", events=["invoice.create"])
    for n in range(3):
        add_invoice(conn, f"L-{n}")
    batch = await fan_out(db_url, lease(limit=2))
    assert (batch.created, batch.quiet, batch.claims) == (3, True, None)
    assert leased_rows(conn) == []


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
