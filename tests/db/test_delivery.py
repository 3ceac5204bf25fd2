"""Claims and records: leases, caps per subscription and per owner, no attempt sent twice
at once; a batch of outcomes the database refuses is split, and the rest recorded (the
worker recording whatever a target answers: tests/e2e/test_hostile_answers.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from service.db import query
from service.store import Store
from service.worker import delivery
from service.worker.delivery import Claim, Outcome, release
from service.worker.pacing import claim_params
from service.worker.pruning import prune
from service.worker.recorder import Recorder, record
from tests.support.claims import claim
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe
from tests.support.worker import make_settings, open_pool


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with open_pool(db_url, max_size=8) as p:
        yield p


async def queue(pool: AsyncConnectionPool, conn: psycopg.Connection, n: int,
                subscribers: int = 1) -> list[int]:
    ids = [subscribe(conn, f"http://s{i}.example/", events=["invoice.create"])[0]
           for i in range(subscribers)]
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'Q' || g, 'c', 1 FROM generate_series(1, %s) g", (n,))
    await drain_outbox(Store(pool), 1000)
    return ids


async def take(pool: AsyncConnectionPool, limit: int, busy: dict[int, int] | None = None,
               per_target: int = 100, lease: float = 60.0) -> list[Claim]:
    return await claim(Store(pool), limit=limit, per_target=per_target, busy=busy or {},
                       lease=lease, scan=100)


async def test_concurrent_claims_never_overlap(pool: AsyncConnectionPool,
                                               conn: psycopg.Connection) -> None:
    await queue(pool, conn, 200)
    ids: list[int] = []
    for _ in range(10):  # rows another claim holds are skipped, not waited for
        batches = await asyncio.gather(*(take(pool, 30) for _ in range(8)))
        ids += [c.id for batch in batches for c in batch]
        if len(ids) >= 200:
            break
    assert len(ids) == len(set(ids)) == 200
    # Claimed work is not due again until its lease runs out.
    assert await take(pool, 30) == []


async def test_expired_lease_comes_due_again(pool: AsyncConnectionPool,
                                             conn: psycopg.Connection) -> None:
    await queue(pool, conn, 1)
    first = await take(pool, 10, lease=0.2)
    assert [c.attempts for c in first] == [1]
    assert await take(pool, 10) == []
    await asyncio.sleep(0.3)  # the lease is a wall-clock time in the table
    again = await take(pool, 10)
    assert [(c.id, c.attempts) for c in again] == [(first[0].id, 2)]


async def test_claims_are_ordered_and_capped_per_subscription(
        pool: AsyncConnectionPool, conn: psycopg.Connection) -> None:
    a, b = await queue(pool, conn, 10, subscribers=2)
    got = await take(pool, 100, busy={a: 1}, per_target=3)
    per_sub = {a: [c.id for c in got if c.subscription_id == a],
               b: [c.id for c in got if c.subscription_id == b]}
    assert len(per_sub[a]) == 2 and len(per_sub[b]) == 3
    assert [c.id for c in got] == sorted(c.id for c in got)
    # A saturated subscription is skipped: the other's work is found behind it.
    more = await take(pool, 100, busy={a: 3, b: 3}, per_target=3)
    assert more == []
    more = await take(pool, 100, busy={a: 3}, per_target=3)
    assert {c.subscription_id for c in more} == {b} and len(more) == 3


async def test_claims_hold_the_per_owner_cap(pool: AsyncConnectionPool,
                                             conn: psycopg.Connection) -> None:
    greedy = [subscribe(conn, f"http://g{n}.example/", events=["invoice.create"],
                        owner="greedy")[0] for n in range(6)]
    other = subscribe(conn, "http://o.example/", events=["invoice.create"], owner="other")[0]
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'C' || g, 'c', 1 FROM generate_series(1, 5) g")
    await drain_outbox(Store(pool), 1000)
    got = await claim(Store(pool), limit=100, per_target=2, busy={}, lease=60.0, scan=100,
                      per_owner=4)
    by_owner: dict[str, int] = {}
    for c in got:
        by_owner[c.owner] = by_owner.get(c.owner, 0) + 1
    assert by_owner == {"greedy": 4, "other": 2}
    assert all(c.subscription_id in greedy for c in got if c.owner == "greedy")
    # What the owner already has in flight counts; a saturated owner is skipped in the scan,
    # so the others' work behind its queue is still found.
    more = await claim(Store(pool), limit=100, per_target=2, busy={other: 2}, lease=60.0, scan=5,
                       per_owner=4, busy_owners={"greedy": 4, "other": 2})
    assert more == []
    more = await claim(Store(pool), limit=100, per_target=5, busy={other: 2}, lease=60.0, scan=5,
                       per_owner=4, busy_owners={"greedy": 4, "other": 2})
    assert [c.owner for c in more] == ["other", "other"]


async def test_inactive_subscription_deliveries_are_closed(
        pool: AsyncConnectionPool, conn: psycopg.Connection) -> None:
    (sid,) = await queue(pool, conn, 3)
    conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s", (sid,))
    assert await take(pool, 10) == []
    rows = conn.execute("SELECT DISTINCT status FROM webhooks.deliveries").fetchall()
    assert rows == [("failed",)]


def outcome(c: Claim, status: int, result: str, retry_in: float = 0.0) -> Outcome:
    return Outcome(c, status, result, retry_in, time.time(), 1.5,
                   None if result == "succeeded" else "err")


async def test_stale_outcome_does_not_overwrite_a_newer_claim(
        pool: AsyncConnectionPool, conn: psycopg.Connection) -> None:
    await queue(pool, conn, 1)
    (old,) = await take(pool, 1, lease=0.1)
    await asyncio.sleep(0.2)
    (new,) = await take(pool, 1)
    await record(Store(pool), [outcome(old, 500, "pending", 10.0)])
    row = conn.execute("SELECT status, attempts, lease_expires_at IS NOT NULL"
                       " FROM webhooks.deliveries").fetchone()
    assert row == ("pending", 2, True)  # still the new claim's
    await record(Store(pool), [outcome(new, 200, "succeeded")])
    assert conn.execute("SELECT status FROM webhooks.deliveries").fetchone() == ("succeeded",)
    # Both attempts are in the log.
    assert conn.execute("SELECT count(*) FROM webhooks.attempts").fetchone() == (2,)


async def test_release_gives_the_attempt_back(pool: AsyncConnectionPool,
                                              conn: psycopg.Connection) -> None:
    await queue(pool, conn, 2)
    claims = await take(pool, 10)
    await release(Store(pool), claims)
    again = await take(pool, 10)
    assert [(c.id, c.attempts) for c in again] == [(c.id, 1) for c in claims]


async def test_a_released_claim_keeps_its_place_in_the_queue(
        pool: AsyncConnectionPool, conn: psycopg.Connection) -> None:
    """Given back (behind a degraded target, or at shutdown), a delivery is due again at the
    time it was due when claimed: the queue's later deliveries, due since, do not pass it
    (a backfill's snapshots start in id order)."""
    await queue(pool, conn, 3)
    (first,) = await take(pool, 1)
    await release(Store(pool), [first])
    due = conn.execute("SELECT next_attempt_at FROM webhooks.deliveries WHERE id = %s",
                       (first.id,)).fetchone()
    assert due == (first.due,)
    assert [c.id for c in await take(pool, 1)] == [first.id]


async def test_deleted_subscription_outcome_is_dropped(pool: AsyncConnectionPool,
                                                       conn: psycopg.Connection) -> None:
    (sid,) = await queue(pool, conn, 1)
    (c,) = await take(pool, 1)
    conn.execute("DELETE FROM webhooks.subscriptions WHERE id = %s", (sid,))
    await record(Store(pool), [outcome(c, 200, "succeeded")])
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries").fetchone() == (0,)


async def test_a_batch_that_fails_is_split_and_the_rest_recorded(
        db_url: str, conn: psycopg.Connection) -> None:
    for n in range(3):
        subscribe(conn, f"http://s{n}.example/", events=["invoice.create"])
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'B' || g, 'c', 1 FROM generate_series(1, 3) g")
    settings = make_settings(db_url)
    async with open_pool(db_url) as pool:
        await drain_outbox(Store(pool), 1000)
        claims = await claim(Store(pool), limit=100, per_target=100, busy={}, lease=60.0,
                                      scan=100)
        assert len(claims) == 9
        outcomes = [delivery.decide(c, settings, status=500, retry_after=None,
                                    attempted_at=time.time(), duration_ms=1.0,
                                    error="boom") for c in claims]
        # A value Postgres refuses, whatever the text cleaning does (a next attempt past
        # the end of time): it fails its batch, every time.
        outcomes[4] = dataclasses.replace(outcomes[4], retry_in=1e300)
        recorder = Recorder(Store(pool))
        for o in outcomes:
            recorder.add(o)
        recorder.close()
        await asyncio.wait_for(recorder.run(), 20)
    assert recorder.recorded == 8 and recorder.dropped == 1
    assert conn.execute("SELECT count(*) FROM webhooks.attempts").fetchone() == (8,)
    bad = outcomes[4].claim.id
    # The dropped one is still claimed: its lease brings it back.
    assert conn.execute("SELECT count(*) FROM webhooks.attempts WHERE delivery_id = %s",
                        (bad,)).fetchone() == (0,)
    assert conn.execute("SELECT status, lease_expires_at IS NOT NULL FROM webhooks.deliveries"
                        " WHERE id = %s", (bad,)).fetchone() == ("pending", True)


def test_claim_uses_the_due_index(conn: psycopg.Connection) -> None:
    conn.execute("SET enable_seqscan = off")  # tiny tables: ask whether the index can serve
    params = {"limit": 10, "scan": 100, "per_target": 8, "per_owner": 32, "lease": 60.0,
              "busy_ids": [], "busy_counts": [], "saturated": [], "degraded": [],
              "owner_names": ["a"], "owner_counts": [1], "saturated_owners": ["b"],
              "lane_sids": [], "lane_since": [], "since": None}
    with conn.cursor() as cur:
        plan = cur.execute(b"EXPLAIN " + query("claim").encode(), params).fetchall()
    # Each partition's copy of deliveries_due_idx.
    assert any("next_attempt_at_id_idx" in line for (line,) in plan)


async def test_prune_never_drops_todays_work(pool: AsyncConnectionPool,
                                            conn: psycopg.Connection) -> None:
    """Retention drops whole days (tests/db/test_partitions.py); today's finished and pending
    deliveries stay whatever the retention."""
    await queue(pool, conn, 3)
    done, failed, _ = await take(pool, 3)
    await record(Store(pool), [outcome(done, 200, "succeeded"), outcome(failed, 500, "failed")])
    assert await prune(Store(pool), retention=0.0) == 0
    rows = conn.execute("SELECT status FROM webhooks.deliveries ORDER BY id").fetchall()
    assert rows == [("succeeded",), ("failed",), ("pending",)]
    assert conn.execute("SELECT count(*) FROM webhooks.attempts").fetchone() == (2,)


async def test_a_subscription_deleted_while_its_outcome_is_recorded_never_deadlocks(
        pool: AsyncConnectionPool, conn: psycopg.Connection, db_url: str) -> None:
    # The record waits for the subscription while the same transaction that holds it
    # deletes it (and, by trigger, its deliveries): the record must not hold the delivery
    # by then, or PostgreSQL finds a deadlock after deadlock_timeout and fails one of them.
    (sid,) = await queue(pool, conn, 1)
    (c,) = await take(pool, 1)
    with psycopg.connect(db_url) as app:  # one transaction, as an application's DELETE
        app.execute("SELECT 1 FROM webhooks.subscriptions WHERE id = %s FOR UPDATE", (sid,))
        recording = asyncio.create_task(record(Store(pool), [outcome(c, 200, "succeeded")]))

        def record_waits() -> bool:
            return conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%%jsonb_array_elements%%'").fetchone() == (1,)

        deadline = time.monotonic() + 10
        while not record_waits():
            assert not recording.done(), recording
            assert time.monotonic() < deadline, "the record never waited for the lock"
            await asyncio.sleep(0.01)
        app.execute("SET LOCAL lock_timeout = '5s'")
        app.execute("DELETE FROM webhooks.subscriptions WHERE id = %s", (sid,))
        app.commit()
    await asyncio.wait_for(recording, 10)  # raises if the record was the one that failed
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM webhooks.subscriptions").fetchone() == (0,)


async def test_the_lane_walks_the_queues_in_turn_and_finds_those_with_due_deliveries(
        pool: AsyncConnectionPool, conn: psycopg.Connection) -> None:
    sids = sorted(await queue(pool, conn, 3, subscribers=3))
    ids = {sid: [r[0] for r in conn.execute(
        "SELECT id FROM webhooks.deliveries WHERE subscription_id = %s ORDER BY id",
        (sid,))] for sid in sids}
    # The first queue's first delivery is in flight: its next one is that queue's head.
    conn.execute("UPDATE webhooks.deliveries SET next_attempt_at = now() + interval '1 min'"
                 " WHERE id = %s", (ids[sids[0]][0],))
    store = Store(pool)
    walk = await store.others_due(after=0, steps=2, take=10, busy=[])
    assert walk["last"] == sids[1]  # stopped after two: the next walk goes on from there
    assert walk["sids"] == sids[:2] and walk["owners"] == ["tests", "tests"]
    # Each queue's probe starts at its first due delivery's day.
    (created,) = conn.execute("SELECT array_agg(created_at ORDER BY subscription_id)"
                              " FROM webhooks.deliveries WHERE id = ANY (%s)",
                              ([ids[sids[0]][1], ids[sids[1]][0]],)).fetchone() or (None,)
    assert walk["created"] == created
    walk = await store.others_due(after=walk["last"], steps=2, take=10, busy=[])
    assert walk["last"] == 0 and walk["sids"] == [sids[2]]  # the end: from 0 again
    # Queues this worker is sending already are left to it; at most `take` queues.
    walk = await store.others_due(after=0, steps=5, take=10, busy=[sids[0]])
    assert walk["sids"] == [sids[1], sids[2]]
    walk = await store.others_due(after=0, steps=5, take=1, busy=[])
    assert walk["sids"] == [sids[0]]
    # The same when its oldest is due (above it was not): walked past, not found.
    walk = await store.others_due(after=0, steps=5, take=10, busy=[sids[1]])
    assert walk["last"] == 0 and walk["sids"] == [sids[0], sids[2]]
    # The claim takes every due delivery of the lane's queues, up to each one's room,
    # beside the oldest its scan reaches (one here: the second queue's first).
    lane = dict(zip(walk["sids"], walk["created"], strict=True))
    params = claim_params(limit=10, per_target=100, busy={sids[2]: 98}, lease=60.0, scan=1,
                          lane=lane)
    params["scan"] = 1
    got = await store.claim(Claim, params)
    assert sorted(c.id for c in got) == sorted([ids[sids[1]][0], *ids[sids[0]][1:],
                                                *ids[sids[2]][:2]])
    # Everything due again (as when leases expire): a degraded queue gives one, and each
    # of the lane's queues at most its share of the claim (two of four here).
    conn.execute("UPDATE webhooks.deliveries SET next_attempt_at = now()")
    params = claim_params(limit=4, per_target=100, busy={}, lease=60.0, scan=1,
                          degraded=[sids[0]], lane=lane)
    params["scan"] = 1
    got = await store.claim(Claim, params)
    assert sorted(c.id for c in got) == sorted([ids[sids[0]][0], *ids[sids[2]][:2]])
