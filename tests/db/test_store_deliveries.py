"""The store's delivery log, requeues and backfills (service/store/deliveries.py and
service/store/backfill.py, the queries of sql/queries/deliveries.sql and backfill.sql)
called directly, as the API's handlers (service/api/deliveries.py, backfills.py) call
them: the caller's subscription by owner and tenant; a page of deliveries (status, event,
[since, until), the `before` cursor, limit; newest first; never another subscription's);
one delivery and its attempts; attempts per hour; redeliver and recover, with the
SQLSTATEs the API maps to 404 and 409; test events; starting and following backfills.

The same through HTTP, with a worker and a receiver: tests/e2e/test_delivery_log.py,
tests/e2e/test_recovery.py and tests/e2e/test_backfill.py; the SQL functions underneath:
tests/db/test_recovery.py and tests/db/test_backfill_sql.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from service.api import backfills as backfill_api
from service.api.deliveries import INACTIVE, UNKNOWN
from service.store import Store, StoreRejected
from tests.support.subscriptions import subscribe
from tests.support.worker import poll

T = TypeVar("T")


@pytest.fixture
def store(pool: AsyncConnectionPool) -> Store:
    """The store over the test database's pool, as the API holds it."""
    return Store(pool)


def seed(conn: psycopg.Connection, sid: int, created: str | datetime, *,
         status: str = "failed", name: str = "invoice.create", body: str = "{}") -> int:
    """One event and one delivery of it to `sid`, created at `created` (its day's
    partitions made); a finished one (not pending) finished then. Returns its id."""
    conn.execute("SELECT webhooks.ensure_partitions(%s::timestamptz, %s::timestamptz)",
                 (created, created))
    row = conn.execute(
        "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
        " VALUES (nextval('webhooks.event_ids'), 'invoices', %s, %s::timestamptz, %s)"
        " RETURNING id)"
        " INSERT INTO webhooks.deliveries (event_id, subscription_id, status, attempts,"
        " created_at, next_attempt_at, finished_at)"
        " SELECT e.id, %s, %s, 3, %s::timestamptz, now() + interval '1 hour',"
        " CASE WHEN %s <> 'pending' THEN %s::timestamptz END FROM e RETURNING id",
        (name, created, body, sid, status, created, status, created)).fetchone()
    assert row is not None
    return int(row[0])


def add_attempt(conn: psycopg.Connection, did: int, sid: int, attempt: int,
                at: str | datetime, status: int, error: str | None = None) -> None:
    """One attempt of the delivery `did` at `at` (its day's partitions made)."""
    conn.execute("SELECT webhooks.ensure_partitions(%s::timestamptz, %s::timestamptz)",
                 (at, at))
    conn.execute("INSERT INTO webhooks.attempts (delivery_id, subscription_id, attempt,"
                 " attempted_at, status, duration_ms, error)"
                 " VALUES (%s, %s, %s, %s::timestamptz, %s, 12.5, %s)",
                 (did, sid, attempt, at, status, error))


def statuses(conn: psycopg.Connection) -> dict[int, str]:
    return dict(conn.execute("SELECT id, status FROM webhooks.deliveries").fetchall())


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text)


async def listed(store: Store, sid: int, *, status: str | None = None,
                 event: str | None = None, since: datetime | None = None,
                 until: datetime | None = None, before: int | None = None,
                 limit: int = 100) -> list[int]:
    """The ids of a page of the subscription's deliveries."""
    rows = await store.list_deliveries(subscription_id=sid, status=status, event=event,
                                       since=since, until=until, before=before, limit=limit)
    return [r["id"] for r in rows]


# --- the caller's subscription --------------------------------------------------------

async def test_delivery_subscription_is_the_owners_within_the_tenant(
        conn: psycopg.Connection, store: Store) -> None:
    untenanted, _ = subscribe(conn, owner="alice")
    acme, _ = subscribe(conn, owner="alice", tenant="acme")
    idle, _ = subscribe(conn, owner="alice", tenant="acme", active=False)
    mallorys, _ = subscribe(conn, owner="mallory")

    async def seen(sid: int, owner: str, tenant: str | None) -> dict[str, Any] | None:
        return await store.delivery_subscription(id=sid, owner=owner, tenant=tenant)

    assert await seen(untenanted, "alice", None) == {"id": untenanted, "active": True}
    # A token without a tenant sees every tenant of its owner; one with a tenant, only it.
    assert await seen(acme, "alice", None) == {"id": acme, "active": True}
    assert await seen(acme, "alice", "acme") == {"id": acme, "active": True}
    assert await seen(idle, "alice", "acme") == {"id": idle, "active": False}
    assert await seen(acme, "alice", "globex") is None
    assert await seen(untenanted, "alice", "acme") is None
    # Another owner's id is unknown, however close the name.
    assert await seen(mallorys, "alice", None) is None
    assert await seen(untenanted, "mallory", None) is None
    assert await seen(untenanted, "Alice", None) is None
    assert await seen(untenanted, "alice ", None) is None
    assert await seen(987654, "alice", None) is None


# --- the list -------------------------------------------------------------------------

async def test_list_is_newest_first_and_only_this_subscriptions(
        conn: psycopg.Connection, store: Store) -> None:
    sid, _ = subscribe(conn)
    other, _ = subscribe(conn)
    first = seed(conn, sid, "2026-01-02T00:00:00Z", status="failed")
    # Made later (a higher id) but created earlier: the list goes by creation time.
    older = seed(conn, sid, "2026-01-01T00:00:00Z", status="succeeded",
                 name="invoice.update")
    newest = seed(conn, sid, "2026-01-03T00:00:00Z", status="pending")
    theirs = seed(conn, other, "2026-01-02T12:00:00Z")
    add_attempt(conn, first, sid, 1, "2026-01-02T00:00:01Z", 503, "down")
    add_attempt(conn, first, sid, 2, "2026-01-02T00:01:00Z", 0, "timed out")
    add_attempt(conn, older, sid, 1, "2026-01-01T00:00:01Z", 200)

    rows = await store.list_deliveries(subscription_id=sid, status=None, event=None,
                                       since=None, until=None, before=None, limit=100)
    assert [r["id"] for r in rows] == [newest, first, older]
    by_id = {r["id"]: r for r in rows}
    assert by_id[older]["event"] == "invoice.update"
    assert by_id[first]["event"] == "invoice.create"
    # The latest attempt's status, even when it got no answer (0).
    assert [by_id[d]["last_status"] for d in (newest, first, older)] == [None, 0, 200]
    # When the next attempt is due only while pending; finished_at only once finished.
    assert by_id[newest]["next_attempt_at"] is not None
    assert by_id[newest]["finished_at"] is None
    assert by_id[first]["next_attempt_at"] is None
    assert by_id[first]["finished_at"] == utc("2026-01-02T00:00:00+00:00")
    assert by_id[first]["created_at"] == utc("2026-01-02T00:00:00+00:00")
    assert await listed(store, other) == [theirs]
    assert await listed(store, 987654) == []


async def test_list_filters_by_status_and_event(conn: psycopg.Connection,
                                                store: Store) -> None:
    sid, _ = subscribe(conn)
    other, _ = subscribe(conn)
    a = seed(conn, sid, "2026-01-01T00:00:00Z", status="failed")
    b = seed(conn, sid, "2026-01-02T00:00:00Z", status="succeeded", name="invoice.update")
    c = seed(conn, sid, "2026-01-03T00:00:00Z", status="failed", name="invoice.update")
    d = seed(conn, sid, "2026-01-04T00:00:00Z", status="pending")
    seed(conn, other, "2026-01-05T00:00:00Z", status="failed", name="invoice.update")
    assert await listed(store, sid, status="failed") == [c, a]
    assert await listed(store, sid, status="pending") == [d]
    assert await listed(store, sid, status="succeeded") == [b]
    assert await listed(store, sid, event="invoice.update") == [c, b]
    assert await listed(store, sid, status="failed", event="invoice.update") == [c]
    assert await listed(store, sid, status="pending", event="invoice.update") == []
    # The event is matched as it is: no pattern, no case folding.
    assert await listed(store, sid, event="invoice.%") == []
    assert await listed(store, sid, event="Invoice.create") == []


async def test_list_window_includes_since_and_excludes_until(conn: psycopg.Connection,
                                                             store: Store) -> None:
    sid, _ = subscribe(conn)
    before = seed(conn, sid, "2026-01-01T23:59:59.999999Z")
    at_since = seed(conn, sid, "2026-01-02T00:00:00Z")
    inside = seed(conn, sid, "2026-01-02T12:00:00Z")
    at_until = seed(conn, sid, "2026-01-03T00:00:00Z")
    since, until = utc("2026-01-02T00:00:00+00:00"), utc("2026-01-03T00:00:00+00:00")
    assert await listed(store, sid, since=since, until=until) == [inside, at_since]
    assert await listed(store, sid, since=since) == [at_until, inside, at_since]
    assert await listed(store, sid, until=until) == [inside, at_since, before]
    # The same instants written with another offset.
    assert await listed(store, sid, since=utc("2026-01-02T01:00:00+01:00"),
                        until=utc("2026-01-02T19:00:00-05:00")) == [inside, at_since]
    assert await listed(store, sid, since=until, until=since) == []


async def test_pages_follow_the_before_cursor_without_gaps_or_repeats(
        conn: psycopg.Connection, store: Store) -> None:
    sid, _ = subscribe(conn)
    # Three created at the same instant (as one fan-out makes them): by id, newest first.
    same = [seed(conn, sid, "2026-01-02T00:00:00Z") for _ in range(3)]
    # Made after them, created before them: a cursor on ids alone would lose it.
    early = seed(conn, sid, "2026-01-01T00:00:00Z")
    late = seed(conn, sid, "2026-01-03T00:00:00Z")
    everything = await listed(store, sid)
    assert everything == [late, same[2], same[1], same[0], early]
    # As the API pages: limit + 1 asked, the last shown id the next cursor.
    seen: list[int] = []
    cursor: int | None = None
    while True:
        page = await listed(store, sid, before=cursor, limit=3)
        seen += page[:2]
        if len(page) <= 2:
            break
        cursor = page[1]
    assert seen == everything
    assert await listed(store, sid, before=same[1]) == [same[0], early]
    # Between deliveries of the same instant, by id.
    assert await listed(store, sid, before=same[2], limit=1) == [same[1]]
    assert await listed(store, sid, before=early) == []


async def test_a_cursor_that_is_not_this_subscriptions_ends_the_list(
        conn: psycopg.Connection, store: Store) -> None:
    sid, _ = subscribe(conn)
    other, _ = subscribe(conn)
    mine = [seed(conn, sid, f"2026-01-0{day}T00:00:00Z") for day in (1, 2, 3)]
    theirs = seed(conn, other, "2026-01-04T00:00:00Z")
    # Another subscription's delivery, or one pruned meanwhile: no page, rather than the
    # first page again (or a page placed by another subscription's delivery).
    assert await listed(store, sid, before=theirs) == []
    assert await listed(store, sid, before=max([*mine, theirs]) + 1000) == []
    assert await listed(store, sid, before=mine[2]) == [mine[1], mine[0]]


# --- one delivery and its attempts ----------------------------------------------------

async def test_get_delivery_is_scoped_by_subscription_when_one_is_given(
        conn: psycopg.Connection, store: Store) -> None:
    sid, _ = subscribe(conn)
    other, _ = subscribe(conn)
    # The body exactly as stored (and sent): 42.00 stays 42.00, the spacing stays.
    body = '{"event": {"name": "invoice.create"},  "resource": {"amount": 42.00, "n": "é"}}'
    did = seed(conn, sid, "2026-01-02T00:00:00Z", status="succeeded", body=body)
    row = await store.get_delivery(id=did, subscription_id=sid)
    assert row is not None
    assert row["body"] == body
    assert (row["id"], row["subscription_id"], row["event"], row["status"]) == (
        did, sid, "invoice.create", "succeeded")
    assert await store.get_delivery(id=did, subscription_id=other) is None
    assert await store.get_delivery(id=did, subscription_id=987654) is None
    anyone = await store.get_delivery(id=did, subscription_id=None)
    assert anyone is not None and anyone["subscription_id"] == sid
    assert await store.get_delivery(id=did + 1000, subscription_id=sid) is None


async def test_attempts_are_oldest_first_across_a_redelivery(conn: psycopg.Connection,
                                                             store: Store) -> None:
    sid, _ = subscribe(conn)
    did = seed(conn, sid, "2026-01-02T00:00:00Z")
    neighbour = seed(conn, sid, "2026-01-02T00:00:00Z")
    # Recorded out of time order; numbering restarts after a redelivery.
    add_attempt(conn, did, sid, 1, "2026-01-03T00:00:00Z", 200)
    add_attempt(conn, did, sid, 2, "2026-01-02T00:05:00Z", 0, "timed out")
    add_attempt(conn, did, sid, 1, "2026-01-02T00:00:01Z", 503, "down")
    add_attempt(conn, neighbour, sid, 1, "2026-01-02T00:03:00Z", 500)
    attempts = await store.delivery_attempts(id=did)
    assert [(a["attempt"], a["status"], a["error"]) for a in attempts] == [
        (1, 503, "down"), (2, 0, "timed out"), (1, 200, None)]
    assert set(attempts[0]) == {"attempt", "attempted_at", "status", "duration_ms", "error"}
    assert attempts[0]["attempted_at"] == utc("2026-01-02T00:00:01+00:00")
    assert attempts[0]["duration_ms"] == 12.5
    assert await store.delivery_attempts(id=did + 1000) == []


# --- attempts per hour ----------------------------------------------------------------

def current_hour(conn: psycopg.Connection) -> datetime:
    row = conn.execute("SELECT date_trunc('hour', now(), 'UTC')").fetchone()
    assert row is not None
    return row[0].astimezone(UTC)


def label(hour: datetime) -> str:
    return hour.astimezone(UTC).strftime("%Y-%m-%dT%H:00:00Z")


async def in_one_hour(conn: psycopg.Connection, run: Callable[[datetime], Awaitable[T]]
                      ) -> tuple[datetime, T]:
    """`run(hour)` with the current hour (UTC), again (once) if the hour turned
    meanwhile, so that what it seeded and what it read share their hour."""
    for _ in range(2):
        hour = current_hour(conn)
        result = await run(hour)
        if current_hour(conn) == hour:
            return hour, result
    raise AssertionError("the hour turned twice")


async def test_stats_counts_each_hour_of_the_window(conn: psycopg.Connection,
                                                    store: Store) -> None:
    async def run(hour: datetime) -> list[dict[str, Any]]:
        sid, _ = subscribe(conn)
        other, _ = subscribe(conn)
        did = seed(conn, sid, hour - timedelta(hours=3))
        start = hour - timedelta(hours=2)  # of a 3-hour window
        add_attempt(conn, did, sid, 1, start - timedelta(microseconds=1), 500)  # before it
        add_attempt(conn, did, sid, 2, start, 200)
        add_attempt(conn, did, sid, 3, start + timedelta(minutes=59, seconds=59), 201)
        add_attempt(conn, did, sid, 4, hour - timedelta(minutes=55), 503)
        add_attempt(conn, did, sid, 5, hour - timedelta(minutes=50), 0, "refused")
        for n, status in enumerate((204, 299, 300, 199), start=6):
            add_attempt(conn, did, sid, n, hour + timedelta(seconds=1), status)
        theirs = seed(conn, other, hour - timedelta(hours=1))
        add_attempt(conn, theirs, other, 1, hour, 200)
        return await store.delivery_stats(id=sid, hours=3)

    hour, rows = await in_one_hour(conn, run)
    assert rows == [
        {"hour": label(hour - timedelta(hours=2)), "succeeded": 2, "failed": 0,
         "unanswered": 0},
        {"hour": label(hour - timedelta(hours=1)), "succeeded": 0, "failed": 1,
         "unanswered": 1},
        {"hour": label(hour), "succeeded": 2, "failed": 2, "unanswered": 0},
    ]


async def test_stats_has_every_hour_even_without_attempts(conn: psycopg.Connection,
                                                          store: Store) -> None:
    sid, _ = subscribe(conn)

    async def run(hour: datetime) -> list[list[dict[str, Any]]]:
        return [await store.delivery_stats(id=sid, hours=n) for n in (1, 168)]

    hour, (one, week) = await in_one_hour(conn, run)
    assert one == [{"hour": label(hour), "succeeded": 0, "failed": 0, "unanswered": 0}]
    assert [r["hour"] for r in week] == [label(hour - timedelta(hours=167 - i))
                                         for i in range(168)]
    assert {(r["succeeded"], r["failed"], r["unanswered"]) for r in week} == {(0, 0, 0)}


# --- redeliver ------------------------------------------------------------------------

async def test_redeliver_makes_any_delivery_pending_and_due_now(conn: psycopg.Connection,
                                                                store: Store) -> None:
    sid, _ = subscribe(conn)
    done = seed(conn, sid, "2026-01-02T00:00:00Z", status="succeeded")
    untouched = seed(conn, sid, "2026-01-02T00:00:00Z", status="failed")
    add_attempt(conn, done, sid, 1, "2026-01-02T00:00:01Z", 200)
    await store.redeliver(id=done)
    row = conn.execute(
        "SELECT status, attempts, next_attempt_at <= now(), lease_expires_at, finished_at"
        " FROM webhooks.deliveries WHERE id = %s", (done,)).fetchone()
    assert row == ("pending", 0, True, None, None)
    assert statuses(conn)[untouched] == "failed"
    # The log shows it due, and keeps its earlier attempt.
    shown = await store.get_delivery(id=done, subscription_id=sid)
    assert shown is not None and shown["next_attempt_at"] is not None
    assert shown["finished_at"] is None and shown["last_status"] == 200
    assert [a["status"] for a in await store.delivery_attempts(id=done)] == [200]


async def test_redeliver_refusals_carry_the_sqlstates_the_api_maps(
        conn: psycopg.Connection, store: Store) -> None:
    sid, _ = subscribe(conn)
    did = seed(conn, sid, "2026-01-02T00:00:00Z", status="failed")
    with pytest.raises(StoreRejected) as unknown:
        await store.redeliver(id=did + 1000)
    assert unknown.value.sqlstate == UNKNOWN  # 404
    conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s", (sid,))
    with pytest.raises(StoreRejected) as inactive:
        await store.redeliver(id=did)
    assert inactive.value.sqlstate == INACTIVE  # 409
    # As the API runs it: checked and requeued in one transaction, which the refusal
    # leaves as StoreRejected, the delivery unchanged.
    with pytest.raises(StoreRejected) as in_transaction:
        async with store.transaction() as s:
            assert await s.get_delivery(id=did, subscription_id=sid) is not None
            await s.redeliver(id=did)
    assert in_transaction.value.sqlstate == INACTIVE
    assert statuses(conn) == {did: "failed"}


# --- recover --------------------------------------------------------------------------

async def test_recover_requeues_the_failed_ones_of_the_window(conn: psycopg.Connection,
                                                              store: Store) -> None:
    sid, _ = subscribe(conn)
    other, _ = subscribe(conn)
    just_before = seed(conn, sid, "2026-01-01T23:59:59.999999Z")
    at_since = seed(conn, sid, "2026-01-02T00:00:00Z")
    succeeded = seed(conn, sid, "2026-01-02T01:00:00Z", status="succeeded")
    pending = seed(conn, sid, "2026-01-02T02:00:00Z", status="pending")
    inside = seed(conn, sid, "2026-01-02T23:59:59.999999Z")
    at_until = seed(conn, sid, "2026-01-03T00:00:00Z")
    theirs = seed(conn, other, "2026-01-02T12:00:00Z")
    # The window written with offsets: [2026-01-02T00:00Z, 2026-01-03T00:00Z).
    count = await store.recover(subscription_id=sid, since=utc("2026-01-02T01:00:00+01:00"),
                                until=utc("2026-01-02T19:00:00-05:00"))
    assert count == 2
    assert statuses(conn) == {just_before: "failed", at_since: "pending",
                              succeeded: "succeeded", pending: "pending", inside: "pending",
                              at_until: "failed", theirs: "failed"}
    rows = conn.execute(
        "SELECT id, attempts, next_attempt_at <= now(), lease_expires_at, finished_at"
        " FROM webhooks.deliveries WHERE id = ANY(%s) ORDER BY id",
        ([at_since, inside],)).fetchall()
    assert rows == [(at_since, 0, True, None, None), (inside, 0, True, None, None)]
    # A pending delivery keeps its own schedule (not made due now).
    assert conn.execute("SELECT attempts, next_attempt_at > now() FROM webhooks.deliveries"
                        " WHERE id = %s", (pending,)).fetchone() == (3, True)


async def test_recover_without_until_and_again(conn: psycopg.Connection,
                                               store: Store) -> None:
    sid, _ = subscribe(conn)
    old = seed(conn, sid, "2026-01-01T00:00:00Z")
    recent = [seed(conn, sid, f"2026-01-0{day}T00:00:00Z") for day in (2, 3)]
    since = utc("2026-01-02T00:00:00+00:00")
    assert await store.recover(subscription_id=sid, since=since, until=None) == 2
    assert statuses(conn) == {old: "failed", recent[0]: "pending", recent[1]: "pending"}
    # Nothing failed is left there: a second recover (a retried request) requeues none.
    assert await store.recover(subscription_id=sid, since=since, until=None) == 0
    # An empty or reversed window (the API refuses it) requeues nothing.
    assert await store.recover(subscription_id=sid, since=since, until=since) == 0
    assert await store.recover(subscription_id=sid, since=since,
                               until=utc("2025-01-01T00:00:00+00:00")) == 0
    assert statuses(conn)[old] == "failed"


async def test_recover_refusals_carry_the_sqlstates_the_api_maps(
        conn: psycopg.Connection, store: Store) -> None:
    sid, _ = subscribe(conn)
    did = seed(conn, sid, "2026-01-02T00:00:00Z")
    since = utc("2020-01-01T00:00:00+00:00")
    with pytest.raises(StoreRejected) as unknown:
        await store.recover(subscription_id=987654, since=since, until=None)
    assert unknown.value.sqlstate == UNKNOWN
    conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s", (sid,))
    with pytest.raises(StoreRejected) as inactive:
        await store.recover(subscription_id=sid, since=since, until=None)
    assert inactive.value.sqlstate == INACTIVE
    assert statuses(conn) == {did: "failed"}


async def test_recover_of_a_strict_subscription_leaves_only_its_head_due(
        conn: psycopg.Connection, store: Store) -> None:
    sid, _ = subscribe(conn)
    conn.execute("UPDATE webhooks.subscriptions SET ordering = 'strict' WHERE id = %s",
                 (sid,))
    ids = [seed(conn, sid, f"2026-01-0{day}T00:00:00Z") for day in (1, 2, 3)]
    assert await store.recover(subscription_id=sid,
                               since=utc("2026-01-01T00:00:00+00:00"), until=None) == 3
    rows = await store.list_deliveries(subscription_id=sid, status="pending", event=None,
                                       since=None, until=None, before=None, limit=10)
    # The log shows no next attempt for those waiting behind the head.
    assert [(r["id"], r["next_attempt_at"] is not None) for r in rows] == [
        (ids[2], False), (ids[1], False), (ids[0], True)]


# --- test events ----------------------------------------------------------------------

async def test_a_test_event_goes_to_this_subscription_only(conn: psycopg.Connection,
                                                           store: Store) -> None:
    # Subscribed to payments only: the test event comes all the same.
    sid, _ = subscribe(conn, owner="alice", tenant="acme", events=["payment.delete"])
    other, _ = subscribe(conn, owner="alice", tenant="acme")
    created = await store.queue_test_delivery(id=sid)
    assert created is not None
    row = await store.get_delivery(id=created["id"], subscription_id=sid)
    assert row is not None
    assert (row["event"], row["status"], row["subscription_id"]) == (
        "webhook.test", "pending", sid)
    body = json.loads(row["body"])
    assert body == {"event": {"id": row["event_id"], "name": "webhook.test",
                              "resource": "webhooks", "resource_id": sid,
                              "user_id": "alice",
                              "occurred_at": body["event"]["occurred_at"]}}
    assert conn.execute("SELECT tenant, hook_resource FROM webhooks.events WHERE id = %s",
                        (row["event_id"],)).fetchone() == ("acme", "webhooks")
    assert await listed(store, sid) == [created["id"]]
    assert await listed(store, other) == []
    # Each call, a new event and a new delivery.
    again = await store.queue_test_delivery(id=sid)
    assert again is not None and again["id"] != created["id"]
    assert await listed(store, sid, event="webhook.test") == [again["id"], created["id"]]


async def test_no_test_event_for_an_inactive_or_unknown_subscription(
        conn: psycopg.Connection, store: Store) -> None:
    sid, _ = subscribe(conn, active=False)
    assert await store.queue_test_delivery(id=sid) is None
    assert await store.queue_test_delivery(id=987654) is None
    assert conn.execute("SELECT count(*) FROM webhooks.events").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries").fetchone() == (0,)


# --- backfills ------------------------------------------------------------------------

def finish_backfill(conn: psycopg.Connection, bid: int) -> None:
    conn.execute("UPDATE webhooks.backfills SET status = 'done', finished_at = now()"
                 " WHERE id = %s", (bid,))


async def bodies(store: Store, sid: int, limit: int = 100) -> list[dict[str, Any]]:
    return [json.loads(r["body"])
            for r in await store.list_backfills(subscription_id=sid, limit=limit)]


async def test_a_backfill_started_is_followed_by_its_subscription_only(
        conn: psycopg.Connection, store: Store) -> None:
    sid, _ = subscribe(conn)  # invoice and payment events: both tables
    other, _ = subscribe(conn, events=["invoice.create"])
    started = await store.start_backfill(subscription_id=sid, max_per_owner=None)
    bid = started["id"]
    row = await store.get_backfill(id=bid, subscription_id=sid)
    assert row is not None
    body = json.loads(row["body"])
    assert (body["id"], body["webhook_id"], body["status"], body["rows"]) == (
        bid, sid, "running", 0)
    assert body["finished_at"] is None and body["error"] is None
    assert body["tables"] == [
        {"resource": "invoices", "rows": 0, "scanned": 0, "done": False},
        {"resource": "payments", "rows": 0, "scanned": 0, "done": False}]
    assert await bodies(store, sid) == [body]
    # Another subscription (of the same owner) neither sees nor lists it.
    assert await store.get_backfill(id=bid, subscription_id=other) is None
    assert await bodies(store, other) == []
    assert await store.get_backfill(id=bid + 1000, subscription_id=sid) is None


async def test_a_second_start_waits_for_the_first_to_end(conn: psycopg.Connection,
                                                          store: Store) -> None:
    sid, _ = subscribe(conn, events=["invoice.create"])
    first = (await store.start_backfill(subscription_id=sid, max_per_owner=None))["id"]
    with pytest.raises(StoreRejected) as running:
        await store.start_backfill(subscription_id=sid, max_per_owner=None)
    assert running.value.sqlstate == backfill_api.RUNNING  # 409
    assert f"backfill {first} " in str(running.value)
    assert [b["id"] for b in await bodies(store, sid)] == [first]
    finish_backfill(conn, first)
    second = (await store.start_backfill(subscription_id=sid, max_per_owner=None))["id"]
    assert second != first
    # Newest first, within the limit.
    assert [(b["id"], b["status"]) for b in await bodies(store, sid)] == [
        (second, "running"), (first, "done")]
    assert [b["id"] for b in await bodies(store, sid, limit=1)] == [second]


async def test_start_backfill_refusals_leave_nothing_behind(conn: psycopg.Connection,
                                                            store: Store) -> None:
    with pytest.raises(StoreRejected) as unknown:
        await store.start_backfill(subscription_id=987654, max_per_owner=None)
    assert unknown.value.sqlstate == backfill_api.UNKNOWN
    idle, _ = subscribe(conn, events=["invoice.create"], active=False)
    with pytest.raises(StoreRejected) as inactive:
        await store.start_backfill(subscription_id=idle, max_per_owner=None)
    assert inactive.value.sqlstate == backfill_api.INACTIVE
    # The service's own events come from no table: nothing to backfill.
    ops, _ = subscribe(conn, resource="webhooks", events=["webhook.disabled"])
    with pytest.raises(StoreRejected) as nothing:
        await store.start_backfill(subscription_id=ops, max_per_owner=None)
    assert nothing.value.sqlstate == backfill_api.INVALID  # 400
    assert "no events of an attached table" in str(nothing.value)
    assert conn.execute("SELECT count(*) FROM webhooks.backfills").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM webhooks.backfill_tables").fetchone() == (0,)


async def test_the_owners_limit_counts_running_backfills_of_all_its_subscriptions(
        conn: psycopg.Connection, store: Store) -> None:
    first, _ = subscribe(conn, owner="alice", tenant="acme", events=["invoice.create"])
    second, _ = subscribe(conn, owner="alice", tenant="globex", events=["invoice.create"])
    bobs, _ = subscribe(conn, owner="bob", events=["invoice.create"])
    running = (await store.start_backfill(subscription_id=first, max_per_owner=1))["id"]
    with pytest.raises(StoreRejected) as limit:
        await store.start_backfill(subscription_id=second, max_per_owner=1)
    assert limit.value.sqlstate == backfill_api.LIMIT  # 409
    assert await bodies(store, second) == []
    # Another owner's are not counted, nor a backfill that is done.
    await store.start_backfill(subscription_id=bobs, max_per_owner=1)
    finish_backfill(conn, running)
    started = await store.start_backfill(subscription_id=second, max_per_owner=1)
    assert [b["id"] for b in await bodies(store, second)] == [started["id"]]
    # With one running again, a higher limit, or none, lets another start.
    await store.start_backfill(subscription_id=first, max_per_owner=2)
    third, _ = subscribe(conn, owner="alice", events=["invoice.create"])
    await store.start_backfill(subscription_id=third, max_per_owner=None)
    assert conn.execute("SELECT count(*) FROM webhooks.backfills WHERE status = 'running'"
                        ).fetchone() == (4,)


@pytest.mark.parametrize(("same", "max_per_owner", "sqlstate"), [
    (True, None, backfill_api.RUNNING), (False, 1, backfill_api.LIMIT)],
    ids=["same-subscription", "same-owner"])
async def test_two_starts_at_once_start_one(conn: psycopg.Connection, store: Store,
                                            db_url: str, same: bool,
                                            max_per_owner: int | None, sqlstate: str) -> None:
    """A double click, or two clients of one owner: the second start waits for the first's
    commit, then is refused as if it had come after it."""
    first, _ = subscribe(conn, events=["invoice.create"])
    second = first if same else subscribe(conn, events=["invoice.create"])[0]

    def waiting() -> bool:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                           " current_database() AND wait_event_type = 'Lock'").fetchone()
        return row == (1,)

    with psycopg.connect(db_url, autocommit=True) as other:
        with other.transaction():
            other.execute("SELECT webhooks.start_backfill(%s, %s)", (first, max_per_owner))
            racing = asyncio.create_task(
                store.start_backfill(subscription_id=second, max_per_owner=max_per_owner))
            await poll(waiting, what="the second start waiting for the first")
        with pytest.raises(StoreRejected) as refused:
            await racing
    assert refused.value.sqlstate == sqlstate
    assert conn.execute("SELECT subscription_id FROM webhooks.backfills").fetchall() == [
        (first,)]
