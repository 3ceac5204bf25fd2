"""A quiet queue's fan-out leases what it makes (the fanout query's `take`) only where a
claim would: never ahead of a delivery that was already due, within the claim's caps, and
never a batch larger than the room (the leased deliveries, and a worker sending them:
tests/e2e/test_fanout_lease.py)."""

from __future__ import annotations

import psycopg

from service.worker import delivery
from tests.support.fanout import fan_out, lease, leased_rows
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice


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
