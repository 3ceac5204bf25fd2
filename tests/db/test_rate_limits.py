"""Rate limits per subscription: the claims of every worker together take at most what the
subscription's bucket allows (a burst of half a second's worth, refilled at the rate);
what is due beyond it waits, its turn moved ahead at the rate, never dropped or counted
as an attempt, and a limited subscription's backlog delays no other subscription."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from service.worker.delivery import Claim
from tests.support.claims import claim
from tests.support.subscriptions import subscribe
from tests.support.worker import open_pool

RATE = 40


@pytest.fixture
async def pools(db_url: str) -> AsyncIterator[tuple[AsyncConnectionPool, AsyncConnectionPool]]:
    """Two workers' queue connections."""
    async with open_pool(db_url, max_size=2) as one, open_pool(db_url, max_size=2) as two:
        yield one, two


def queue(conn: psycopg.Connection, sid: int, count: int) -> None:
    """`count` due deliveries of one event each for subscription `sid`."""
    conn.execute("""
        WITH e AS (
            INSERT INTO webhooks.events (id, hook_resource, name, tenant, occurred_at, body)
            SELECT nextval('webhooks.event_ids'), 'invoices', 'invoice.create', NULL, now(),
                   '{}'
              FROM generate_series(1, %(count)s)
            RETURNING id)
        INSERT INTO webhooks.deliveries (event_id, subscription_id) SELECT id, %(sid)s FROM e
        """, {"count": count, "sid": sid})


async def take(store: Store) -> list[Claim]:
    return await claim(store, limit=50, per_target=1000, busy={}, lease=60.0, scan=200)


async def test_two_workers_together_keep_to_the_rate(
        conn: psycopg.Connection,
        pools: tuple[AsyncConnectionPool, AsyncConnectionPool]) -> None:
    limited, _ = subscribe(conn)
    conn.execute("UPDATE webhooks.subscriptions SET rate_limit = %s WHERE id = %s",
                 (RATE, limited))
    other, _ = subscribe(conn)
    queue(conn, limited, 400)
    stores = [Store(p) for p in pools]
    taken: list[tuple[float, int]] = []
    start = time.monotonic()
    queue(conn, other, 30)  # behind the limited backlog in the due index
    others_at: float | None = None
    while time.monotonic() - start < 3.0:
        for rows in await asyncio.gather(*(take(s) for s in stores)):
            now = time.monotonic() - start
            taken.extend((now, c.subscription_id) for c in rows)
        done = sum(1 for _, sid in taken if sid == other)
        if others_at is None and done == 30:
            others_at = time.monotonic() - start
        await asyncio.sleep(0.02)
    elapsed = time.monotonic() - start
    sent = [at for at, sid in taken if sid == limited]
    # At most the burst (half a second's worth) beyond the rate, over the whole run and
    # in any one second of it.
    assert RATE * 0.5 <= len(sent) <= RATE * elapsed + RATE * 0.5 + 1, (len(sent), elapsed)
    for second in range(3):
        in_window = [at for at in sent if second <= at < second + 1]
        assert len(in_window) <= RATE * 1.5 + 1, (second, len(in_window))
    # The other subscription's deliveries went at once, whatever waited before them.
    assert others_at is not None and others_at < 1.0, others_at
    # Nothing was dropped or counted: the rest waits, pending, with no attempt made.
    rows = conn.execute("SELECT status, attempts, count(*) FROM webhooks.deliveries"
                        " WHERE subscription_id = %s GROUP BY 1, 2 ORDER BY 1, 2",
                        (limited,)).fetchall()
    assert rows == [("pending", 0, 400 - len(sent)), ("pending", 1, len(sent))]
    # What waits was moved out of the due range, spaced at the rate.
    [(due_now, later, last)] = conn.execute(
        "SELECT count(*) FILTER (WHERE next_attempt_at <= now()),"
        " count(*) FILTER (WHERE next_attempt_at > now()),"
        " extract(epoch FROM max(next_attempt_at) - now())"
        " FROM webhooks.deliveries WHERE subscription_id = %s AND attempts = 0",
        (limited,)).fetchall()
    assert later > 0 and last <= (400 - len(sent)) / RATE + 1.0, (due_now, later, last)


async def test_a_rate_limit_follows_the_subscription(conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn)
    assert conn.execute("SELECT count(*) FROM webhooks.rate_buckets").fetchone() == (0,)
    conn.execute("UPDATE webhooks.subscriptions SET rate_limit = 10 WHERE id = %s", (sid,))
    assert conn.execute("SELECT rate, tokens FROM webhooks.rate_buckets").fetchall() == [
        (10, 5.0)]
    conn.execute("UPDATE webhooks.subscriptions SET rate_limit = 4 WHERE id = %s", (sid,))
    assert conn.execute("SELECT rate, tokens FROM webhooks.rate_buckets").fetchall() == [
        (4, 2.0)]
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE webhooks.subscriptions SET rate_limit = 0 WHERE id = %s", (sid,))
    conn.execute("UPDATE webhooks.subscriptions SET rate_limit = NULL WHERE id = %s", (sid,))
    assert conn.execute("SELECT count(*) FROM webhooks.rate_buckets").fetchone() == (0,)

