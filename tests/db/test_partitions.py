"""The queue tables' daily partitions (sql/partitions.sql, service/worker/pruning.py):
made ahead, dropped whole past retention without losing a pending or requeued delivery,
migration 0005 on a populated database, and the plans of the queue's queries."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from service import db
from service.store import QUEUE_SETTINGS, Store, make_pool
from service.worker import pruning
from service.worker.fanout import fanout_params
from service.worker.pacing import claim_params
from service.worker.pruning import prune
from tests.conftest import SERVER_URL, TEST_OPTIONS, Clones, drop_database, with_dbname
from tests.support.claims import claim
from tests.support.schema import migrate_to
from tests.support.seeds import requeue_before_the_drop, seed_day
from tests.support.worker import open_pool, running_worker

DAY = 86400.0
WEEK = 7 * DAY


@pytest.fixture(autouse=True)
def unspaced_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drops follow each other at once (a drop of a second under a loaded test run paused
    the next for ten): test_retention_spaces_its_drops sets the spacing it checks."""
    monkeypatch.setattr(pruning, "DROP_SPACING", 0.0)


def partitions(conn: psycopg.Connection, parent: str) -> list[str]:
    rows = conn.execute("SELECT partition FROM webhooks.queue_partitions WHERE parent = %s"
                        " ORDER BY lower_bound", (parent,)).fetchall()
    return [r[0] for r in rows]


def subscription(conn: psycopg.Connection) -> int:
    row = conn.execute("INSERT INTO webhooks.subscriptions (owner, resource, events, target,"
                       " secret) VALUES ('o', 'invoices', '{invoice.create}', 'http://x/',"
                       " 's') RETURNING id").fetchone()
    assert row is not None
    return int(row[0])




def count(conn: psycopg.Connection, table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM webhooks.{table}").fetchone()
    assert row is not None
    return int(row[0])


def test_a_fresh_install_has_today_and_two_days_ahead(conn: psycopg.Connection) -> None:
    for parent in ("events", "deliveries", "attempts"):
        rows = conn.execute(
            "SELECT lower_bound = date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE"
            " 'UTC', upper_bound - lower_bound FROM webhooks.queue_partitions"
            " WHERE parent = %s ORDER BY lower_bound", (parent,)).fetchall()
        assert len(rows) == 3, parent
        assert rows[0][0] is True
        assert {r[1].days for r in rows} == {1}


def test_ensure_partitions_is_idempotent_and_refuses_nonsense(
        conn: psycopg.Connection) -> None:
    def days() -> int:
        row = conn.execute("SELECT count(*) FROM webhooks.queue_partitions").fetchone()
        assert row is not None
        return int(row[0])

    before = days()
    made = conn.execute("SELECT webhooks.ensure_partitions(now() - interval '3 days',"
                        " now() + interval '4 days')").fetchone()
    # The template made today and two days ahead (conftest makes a new template when the
    # session crosses midnight UTC): eight days in all now, three tables each.
    assert made == (days() - before,) and days() == 8 * 3
    again = conn.execute("SELECT webhooks.ensure_partitions(now() - interval '3 days',"
                         " now() + interval '4 days')").fetchone()
    assert again == (0,)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="since <= until"):
        conn.execute("SELECT webhooks.ensure_partitions(now(), now() - interval '1 day')")


async def test_retention_drops_old_days_and_keeps_pending_work(
        db_url: str, conn: psycopg.Connection) -> None:
    sid = subscription(conn)
    seed_day(conn, sid, 12, 50)
    seed_day(conn, sid, 11, 50)
    seed_day(conn, sid, 10, 5, status="pending")  # a delivery still being retried
    seed_day(conn, sid, 10, 45)
    seed_day(conn, sid, 9, 50)
    seed_day(conn, sid, 1, 50)
    before = partitions(conn, "deliveries")
    async with open_pool(db_url) as pool:
        dropped = await prune(Store(pool), retention=WEEK)
    # Days 12 and 11 go (deliveries and events); day 10 holds a pending delivery, so it
    # and the days after it stay; every attempts partition older than a week goes (day 9's
    # too: its end is eight days ago).
    assert dropped == 2 * 2 + 4
    after = partitions(conn, "deliveries")
    assert after == before[2:]
    assert partitions(conn, "events") == [p.replace("deliveries", "events") for p in after]
    assert len(partitions(conn, "attempts")) == len(after) - 2
    assert count(conn, "deliveries") == 5 + 45 + 50 + 50
    assert count(conn, "events") == 5 + 45 + 50 + 50
    assert count(conn, "attempts") == 50
    # The pending deliveries are finished: their day goes with the next round, and the
    # day after it too.
    conn.execute("UPDATE webhooks.deliveries SET status = 'failed',"
                  " finished_at = now() - interval '8 days' WHERE status = 'pending'")
    async with open_pool(db_url) as pool:
        assert await prune(Store(pool), retention=WEEK) == 4
    assert count(conn, "deliveries") == 50


async def test_a_delivery_requeued_after_the_choice_is_kept(
        db_url: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """redeliver between expired_partitions and the detach: the detached partition is
    checked again, attached back, and nothing is lost."""
    sid = subscription(conn)
    seed_day(conn, sid, 10, 20)
    chosen = requeue_before_the_drop(conn, monkeypatch)
    async with open_pool(db_url) as pool:
        dropped = await prune(Store(pool), retention=WEEK)
    assert chosen and dropped == 0
    assert count(conn, "deliveries") == 20
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries WHERE status = 'pending'"
                        ).fetchone() == (1,)
    assert chosen[0]["partition"] in partitions(conn, "deliveries")


async def test_an_interrupted_detach_is_finished_next_round(
        db_url: str, conn: psycopg.Connection) -> None:
    sid = subscription(conn)
    seed_day(conn, sid, 10, 10)
    (name,) = partitions(conn, "events")[:1]
    # A detach cancelled in its second phase leaves the partition "detach pending".
    conn.execute("UPDATE pg_catalog.pg_inherits SET inhdetachpending = true"
                 " WHERE inhrelid = %s::regclass", (f"webhooks.{name}",))
    async with open_pool(db_url) as pool:
        assert await prune(Store(pool), retention=WEEK) >= 2
    assert name not in partitions(conn, "events")
    assert count(conn, "events") == 0


async def test_two_pruners_at_once(db_url: str, conn: psycopg.Connection) -> None:
    sid = subscription(conn)
    for days in (12, 11, 10):
        seed_day(conn, sid, days, 10)
    async with open_pool(db_url) as pool:
        results = await asyncio.gather(prune(Store(pool), WEEK), prune(Store(pool), WEEK))
    assert sum(results) == 3 * 3
    assert count(conn, "deliveries") == 0


async def test_retention_spaces_its_drops(db_url: str, conn: psycopg.Connection,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each partition waits DROP_SPACING times as long as the one before it took (freeing
    a partition's files holds up the application's commits on the same disk)."""
    sid = subscription(conn)
    for days in (12, 11):
        seed_day(conn, sid, days, 200)
    spacing = 10.0
    monkeypatch.setattr(pruning, "DROP_SPACING", spacing)
    steps: list[tuple[float, float]] = []
    real_drop = pruning._drop

    async def timed_drop(s: Any, part: dict[str, Any], retention: float) -> bool:
        started = time.monotonic()
        dropped = await real_drop(s, part, retention)
        steps.append((started, time.monotonic()))
        return dropped

    monkeypatch.setattr(pruning, "_drop", timed_drop)
    async with open_pool(db_url) as pool:
        assert await prune(Store(pool), retention=WEEK) == 2 * 3
    assert count(conn, "deliveries") == 0
    for (start, end), (after, _) in itertools.pairwise(steps):
        # The pause is timed around the whole step, the wrapper's own time included.
        assert after - end >= 0.9 * spacing * (end - start), steps


def test_deleting_a_subscription_deletes_its_deliveries(conn: psycopg.Connection) -> None:
    keep, gone = subscription(conn), subscription(conn)
    seed_day(conn, keep, 0, 3)
    seed_day(conn, gone, 0, 4)
    conn.execute("DELETE FROM webhooks.subscriptions WHERE id = %s", (gone,))
    rows = conn.execute("SELECT DISTINCT subscription_id FROM webhooks.deliveries").fetchall()
    assert rows == [(keep,)]


async def test_pending_deliveries_of_a_gone_subscription_are_closed(
        db_url: str, conn: psycopg.Connection) -> None:
    """A fan-out that read a subscription while it was being deleted leaves deliveries no
    claim will ever take; retention deletes them so they never hold their partition."""
    sid = subscription(conn)
    conn.execute("ALTER TABLE webhooks.subscriptions DISABLE TRIGGER"
                 " subscriptions_forget_deliveries")
    seed_day(conn, sid, 0, 3, status="pending")
    conn.execute("DELETE FROM webhooks.subscriptions WHERE id = %s", (sid,))
    conn.execute("ALTER TABLE webhooks.subscriptions ENABLE TRIGGER"
                 " subscriptions_forget_deliveries")
    assert count(conn, "deliveries") == 3
    async with open_pool(db_url) as pool:
        await prune(Store(pool), retention=WEEK)
    assert count(conn, "deliveries") == 0


async def test_retention_keeps_partitions_ahead(db_url: str, conn: psycopg.Connection
                                                ) -> None:
    conn.execute("DROP TABLE webhooks." + partitions(conn, "deliveries")[-1])
    async with open_pool(db_url) as pool:
        await prune(Store(pool), retention=WEEK)
    assert len(partitions(conn, "deliveries")) == 3
    # A delivery made two days from now would have its partition.
    conn.execute("INSERT INTO webhooks.deliveries (event_id, subscription_id, created_at)"
                 " VALUES (1, 1, now() + interval '2 days')")


async def test_the_benchs_history_is_what_the_default_retention_keeps(
        db_url: str, conn: psycopg.Connection) -> None:
    """`make bench` measures on the partitions a running installation has: the seven days
    before today, today and two ahead; a worker's retention drops none of them."""
    from bench.common import keep_history
    from service.config import Settings

    assert keep_history(db_url, 7).startswith("10 daily partitions")
    async with open_pool(db_url) as pool:
        assert await prune(Store(pool), retention=Settings().retention) == 0
    assert len(partitions(conn, "deliveries")) == 10
    assert len(partitions(conn, "events")) == 10


# --- the queue's queries keep their indexes --------------------------------------------

@pytest.fixture(scope="module")
def seeded_db(clones: Clones) -> Iterator[str]:
    """The seven whole days before today, about 23,000 finished deliveries each over 50
    subscriptions (so no partition is small enough to be worth a sequential scan), 2,000
    pending on the last, analysed: one database for the module's tests that only read it."""
    name = clones.take(ahead=False)
    url = with_dbname(SERVER_URL, name)
    try:
        with psycopg.connect(url, autocommit=True, options=TEST_OPTIONS) as conn:
            seed_week(conn)
        yield url
    finally:
        drop_database(name)


@pytest.fixture
def seeded(seeded_db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(seeded_db, autocommit=True, options=TEST_OPTIONS) as conn:
        yield conn


def seed_week(conn: psycopg.Connection) -> None:
    subs = [subscription(conn) for _ in range(50)]
    conn.execute("SELECT webhooks.ensure_partitions(now() - interval '8 days', now())")
    conn.execute(
        "INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body, created_at)"
        " SELECT i, 'invoices', 'invoice.create', t, '{}', t"
        "   FROM generate_series(1, 160000) i,"
        "        LATERAL (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
        "                  - interval '7 days'"
        "                  + make_interval(secs => (i - 1) * (7 * 86400 / 160000.0))) AS x (t)")
    conn.execute(
        "INSERT INTO webhooks.deliveries (event_id, subscription_id, status, created_at,"
        "                                 finished_at, next_attempt_at)"
        " SELECT e.id, (%s::bigint[])[1 + e.id %% 50],"
        "        CASE WHEN e.id > 158000 THEN 'pending' ELSE 'succeeded' END, e.created_at,"
        "        CASE WHEN e.id > 158000 THEN NULL ELSE e.created_at END, e.created_at"
        "   FROM webhooks.events e", (subs,))
    conn.execute("INSERT INTO webhooks.attempts (delivery_id, subscription_id, attempt,"
                 " attempted_at, status, duration_ms)"
                 " SELECT id, subscription_id, 1, created_at, 200, 1 FROM webhooks.deliveries")
    conn.execute("ANALYZE webhooks.events, webhooks.deliveries, webhooks.attempts")


def plan(conn: psycopg.Connection, name: str, params: dict[str, Any]) -> str:
    with conn.cursor() as cur:
        rows = cur.execute(b"EXPLAIN " + db.query(name).encode(), params).fetchall()
    return "\n".join(r[0] for r in rows)


def reads_a_table_whole(plan: str) -> bool:
    """A sequential scan of a queue partition that holds rows (the planner may scan an
    empty partition, one of the days ahead, at no cost; and a hash of this fixture's 50
    subscriptions is its right call)."""
    return any(re.search(r"Seq Scan on (deliveries|events|attempts)_", line)
               and "cost=0.00..0.00 " not in line for line in plan.splitlines())


CLAIM_ALL = {"limit": 100, "scan": 1000, "per_target": 1000, "per_owner": 1000,
             "lease": 60.0, "busy_ids": [], "busy_counts": [], "saturated": [],
             "degraded": [], "owner_names": [], "owner_counts": [], "saturated_owners": [],
             "lane_sids": [], "lane_since": [], "since": None}


def reads_the_newest_days_only(rows: list[tuple[Any, ...]]) -> None:
    """An EXPLAIN ANALYZE of a statement that returned 100 rows of the fixture's last day:
    of its scans of the events days (one per day), at most the days ahead (empty), today
    and that day were read."""
    text = "\n".join(r[0] for r in rows)
    scans = [line for line in text.splitlines() if re.search(r" on events_p\d+ ", line)]
    read = [line for line in scans if "never executed" not in line]
    assert len(scans) >= 10, text
    assert 1 <= len(read) <= 4, "\n".join(read)
    assert "rows=100 " in text.splitlines()[0], text


@pytest.mark.xdist_group("seeded")
def test_claim_finds_each_event_in_the_newest_partitions_first(
        seeded: psycopg.Connection) -> None:
    """A claimed delivery's event is looked up from the newest day back, stopping where it
    is found: the days before it are never read (oldest first, every day of the retention
    before it was probed for each delivery)."""
    conn = seeded
    with conn.transaction(force_rollback=True), conn.cursor() as cur:
        for name, value in QUEUE_SETTINGS.items():
            cur.execute("SELECT set_config(%s, %s, true)", (name, value))
        rows = cur.execute(b"EXPLAIN (ANALYZE, COSTS OFF) " + db.query("claim").encode(),
                           CLAIM_ALL).fetchall()
    # The pending deliveries are yesterday's: the days ahead (empty), today and yesterday.
    reads_the_newest_days_only(rows)


@pytest.mark.xdist_group("seeded")
def test_the_delivery_log_finds_each_event_in_the_newest_partitions_first(
        seeded: psycopg.Connection) -> None:
    """A page of the delivery log reads each delivery's event from the newest day back: the
    first page (the last day's deliveries) never reads the days before them (a join read
    every day's index for each row)."""
    conn = seeded
    sid = conn.execute("SELECT min(id) FROM webhooks.subscriptions").fetchone()
    assert sid is not None
    rows = conn.execute(b"EXPLAIN (ANALYZE, COSTS OFF) " + db.query("deliveries_list").encode(), {
        "subscription_id": sid[0], "before": None, "status": None, "event": None,
        "since": None, "until": None, "limit": 100}).fetchall()
    reads_the_newest_days_only(rows)


@pytest.mark.xdist_group("seeded")
def test_claim_list_and_recover_use_their_indexes(seeded: psycopg.Connection) -> None:
    conn = seeded
    claim = plan(conn, "claim", {
        "limit": 100, "scan": 1000, "per_target": 8, "per_owner": 32, "lease": 60.0,
        "busy_ids": [], "busy_counts": [], "saturated": [], "degraded": [],
        "owner_names": [], "owner_counts": [], "saturated_owners": [],
        "lane_sids": [], "lane_since": [], "since": None})
    assert "due_idx" in claim or "next_attempt_at_id_idx" in claim, claim
    assert not reads_a_table_whole(claim), claim
    sid = conn.execute("SELECT min(id) FROM webhooks.subscriptions").fetchone()
    assert sid is not None
    listing = plan(conn, "deliveries_list", {
        "subscription_id": sid[0], "before": None, "status": None, "event": None,
        "since": None, "until": None, "limit": 100})
    assert not reads_a_table_whole(listing), listing
    assert "Sort" not in listing.split("Limit", 1)[1].split("SubPlan", 1)[0] or \
        "Merge Append" in listing, listing
    one = plan(conn, "deliveries_get", {"id": 1000, "subscription_id": None})
    assert not reads_a_table_whole(one), one
    attempts = plan(conn, "deliveries_attempts", {"id": 1000})
    assert not reads_a_table_whole(attempts), attempts
    with conn.cursor() as cur:
        recover = "\n".join(r[0] for r in cur.execute(
            "EXPLAIN UPDATE webhooks.deliveries d SET status = 'pending'"
            " WHERE d.subscription_id = %s AND d.status = 'failed'"
            "   AND d.created_at >= now() - interval '1 day'", (sid[0],)).fetchall())
    assert not reads_a_table_whole(recover), recover
    # Partitions older than the window are not even visited.
    assert "Subplans Removed: 7" in recover, recover


# --- migration 0005 on a populated database ---------------------------------------------

def test_migration_0005_keeps_300k_deliveries(empty_db: str) -> None:
    """Migration 0005 attaches the old tables as they are, whatever their size (a copy of
    a million rows was the alternative): 300,000 deliveries, events and attempts."""
    migrate_to(empty_db, "0004.failure-lifecycle")
    n = 300_000
    with psycopg.connect(empty_db, autocommit=True, options=TEST_OPTIONS) as conn:
        subs = [subscription(conn) for _ in range(10)]
        conn.execute("INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
                     " SELECT nextval('webhooks.event_ids'), 'invoices', 'invoice.create',"
                     " now() - make_interval(secs => %s - i), '{}'"
                     " FROM generate_series(1, %s) i", (n, n))
        conn.execute(
            "INSERT INTO webhooks.deliveries (event_id, subscription_id, status, created_at,"
            " finished_at, next_attempt_at)"
            " SELECT e.id, (%s::bigint[])[1 + e.id %% 10],"
            " CASE WHEN e.id %% 1000 = 0 THEN 'pending' ELSE 'succeeded' END, e.occurred_at,"
            " CASE WHEN e.id %% 1000 = 0 THEN NULL ELSE e.occurred_at END, e.occurred_at"
            " FROM webhooks.events e", (subs,))
        conn.execute("INSERT INTO webhooks.attempts (delivery_id, subscription_id, attempt,"
                     " attempted_at, status, duration_ms)"
                     " SELECT id, subscription_id, 1, created_at, 200, 1"
                     " FROM webhooks.deliveries")
        last = conn.execute("SELECT max(id) FROM webhooks.deliveries").fetchone()
        assert last is not None
        started = time.monotonic()
        migrate_to(empty_db, "0005.queue-partitions")
        print(f"migration 0005 with {n:,} deliveries: {time.monotonic() - started:.1f} s")
        assert "0005.queue-partitions" not in db.migrate(empty_db)  # the later ones
        assert count(conn, "deliveries") == n
        assert count(conn, "events") == n
        assert count(conn, "attempts") == n
        assert partitions(conn, "deliveries")[0] == "deliveries_legacy"
        assert partitions(conn, "events")[0] == "events_legacy"
        # New rows go to today's partition, with ids after the old ones.
        row = conn.execute(
            "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at,"
            " body) VALUES (nextval('webhooks.event_ids'), 'invoices', 'invoice.create',"
            " now(), '{}') RETURNING id)"
            " INSERT INTO webhooks.deliveries (event_id, subscription_id)"
            " SELECT id, %s FROM e RETURNING id, tableoid::regclass::text", (subs[0],)
        ).fetchone()
        assert row is not None and row[0] > last[0]
        assert row[1].startswith("webhooks.deliveries_p")
        # The old pending deliveries are claimable, by index.
        conn.execute("ANALYZE webhooks.deliveries")
        pending = conn.execute(
            "EXPLAIN SELECT id FROM webhooks.deliveries WHERE status = 'pending'"
            " AND next_attempt_at <= now() ORDER BY next_attempt_at, id LIMIT 10").fetchall()
        assert "Seq Scan" not in "\n".join(r[0] for r in pending)
        # A subscription's deletion still takes its old deliveries with it.
        conn.execute("DELETE FROM webhooks.subscriptions WHERE id = %s", (subs[1],))
        assert count(conn, "deliveries") == n + 1 - n // 10


def test_any_session_time_zone_and_date_style(conn: psycopg.Connection) -> None:
    """Bounds are written and read as text: a session with another time zone and date
    style sees the same days and makes no partition twice."""
    # In the default session first: the template's days may predate midnight UTC.
    conn.execute("SELECT webhooks.ensure_partitions(now(), now() + interval '2 days')")
    conn.execute("SET TimeZone = 'Asia/Kolkata'")
    conn.execute("SET DateStyle = 'SQL, DMY'")
    assert conn.execute("SELECT webhooks.ensure_partitions(now(), now() + interval '2 days')"
                        ).fetchone() == (0,)
    rows = conn.execute("SELECT lower_bound AT TIME ZONE 'UTC' FROM webhooks.queue_partitions"
                        " WHERE parent = 'deliveries' ORDER BY 1").fetchall()
    assert len(rows) >= 3 and {r[0].hour for r in rows} == {0}


def most_rows(plan: dict[str, Any]) -> tuple[int, str]:
    """The most rows a node of an EXPLAIN (ANALYZE, FORMAT JSON) plan handled, and its type."""
    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    return max((n["Actual Rows"] * n["Actual Loops"], n["Node Type"]) for n in nodes(plan))


def test_record_touches_only_the_batch_whatever_the_statistics(
        conn: psycopg.Connection) -> None:
    """The recorder's statement reads each recorded delivery by its key, even right after a
    burst the statistics have not seen: no plan node handles more rows than the batch
    (a join with the queue would read every pending delivery, once per outcome)."""
    sid = subscription(conn)
    conn.execute("INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
                 " SELECT i, 'invoices', 'invoice.create', now(), '{}'"
                 "   FROM generate_series(1, 20000) i")
    conn.execute("INSERT INTO webhooks.deliveries (event_id, subscription_id, attempts)"
                 " SELECT id, %s, 1 FROM webhooks.events", (sid,))
    batch = conn.execute(
        "SELECT jsonb_agg(jsonb_build_array(id, attempts, subscription_id, 200, 'succeeded',"
        " 0, extract(epoch FROM now()), 1.5, NULL, created_at) ORDER BY id)"
        "  FROM (SELECT * FROM webhooks.deliveries ORDER BY id LIMIT 2000) d").fetchone()
    assert batch is not None
    with conn.cursor() as cur:
        rows = cur.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + db.query("record").encode(),
                           {"batch": psycopg.types.json.Jsonb(batch[0])}).fetchone()
    assert rows is not None
    handled = most_rows(rows[0][0]["Plan"])
    assert handled[0] <= 2000, handled
    done = conn.execute("SELECT count(*) FILTER (WHERE status = 'succeeded'),"
                        " (SELECT count(*) FROM webhooks.attempts)"
                        " FROM webhooks.deliveries").fetchone()
    assert done == (2000, 2000)


CLAIM_PARAMS: dict[str, Any] = {
    "limit": 64, "scan": 100, "per_target": 64, "per_owner": 2**31 - 1, "lease": 60.0,
    "busy_ids": "{}", "busy_counts": "{}", "saturated": "{}", "degraded": "{}",
    "owner_names": "{}", "owner_counts": "{}", "saturated_owners": "{}",
    "lane_sids": "{}", "lane_since": "{}", "since": None}


def prepare(conn: psycopg.Connection, name: str, params: dict[str, Any]) -> str:
    """PREPAREs the named query under its own name; returns its EXECUTE statement with
    `params`, in the order of their first use in the text."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    conn.execute(f"PREPARE {name} AS " + re.sub(r"%\((\w+)\)s", number, db.query(name)))
    values = ", ".join(psycopg.sql.quote(params[n]) for n in names)
    return f"EXECUTE {name}({values})"


def queue_settings(conn: psycopg.Connection) -> None:
    """The settings of the worker's queue pool, on `conn` (one with TEST_OPTIONS: `jit` off,
    as on the service's)."""
    for name, value in QUEUE_SETTINGS.items():
        conn.execute(psycopg.sql.SQL("SET {} = {}").format(psycopg.sql.Identifier(name),
                                                           psycopg.sql.Literal(value)))


def backlog(conn: psycopg.Connection, sid: int, n: int) -> None:
    """n pending deliveries to `sid`, each of its own event, made now."""
    conn.execute("INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
                 " SELECT i, 'invoices', 'invoice.create', now(), '{}'"
                 "   FROM generate_series(1, %s) i", (n,))
    conn.execute("INSERT INTO webhooks.deliveries (event_id, subscription_id)"
                 " SELECT id, %s FROM webhooks.events", (sid,))


@pytest.mark.parametrize("lane", [False, True])
@pytest.mark.parametrize("built_on", ["analysed empty", "never analysed"])
def test_claim_plan_holds_whatever_the_statistics(conn: psycopg.Connection,
                                                  built_on: str, lane: bool) -> None:
    """The claim runs on one generic plan per connection (the worker's queue pool): built
    while the day's partition was empty, it still reads the due deliveries of a 3,000
    backlog in order from the due index and reaches each row it takes by key or address:
    no plan node handles more rows than the claim scans (a sort of the queue handles them
    all at every claim, a join with it once per claimed row). The same when the lane for
    other queues names another queue as long, behind it (its probe reads that queue's
    pending index in order)."""
    sid, other = subscription(conn), subscription(conn)
    if built_on == "analysed empty":
        conn.execute("ANALYZE webhooks.deliveries, webhooks.events")
    queue_settings(conn)
    params = CLAIM_PARAMS
    if lane:
        (since,) = conn.execute("SELECT now() - interval '1 day'").fetchone() or (None,)
        params = CLAIM_PARAMS | {"lane_sids": f"{{{other}}}", "lane_since": f'{{"{since}"}}'}
    claim = prepare(conn, "claim", params)
    with conn.transaction():
        assert conn.execute(claim).fetchall() == []  # the generic plan is built here
    backlog(conn, sid, 3000)
    if lane:
        conn.execute("INSERT INTO webhooks.deliveries (event_id, subscription_id)"
                     " SELECT id, %s FROM webhooks.events", (other,))
    conn.execute("BEGIN")
    row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + claim).fetchone()
    conn.execute("ROLLBACK")
    assert row is not None
    plan = row[0][0]["Plan"]
    # The lane's probe reads at most the claim's limit more, beside the scan's rows (the
    # claim takes the lane's first).
    bound = CLAIM_PARAMS["scan"] + (CLAIM_PARAMS["limit"] if lane else 0)
    assert most_rows(plan)[0] <= bound, most_rows(plan)
    assert plan["Actual Rows"] == CLAIM_PARAMS["limit"]
    generic = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                           " WHERE name = 'claim'").fetchone()
    assert generic == (2, 0)


@pytest.mark.parametrize("room", [0, 5000])
@pytest.mark.parametrize("built_on", ["analysed empty", "never analysed"])
def test_fanout_plan_holds_whatever_the_statistics(conn: psycopg.Connection,
                                                   built_on: str, room: int) -> None:
    """The fan-out's generic plan, built on an empty outbox and queue, turns one statement
    of 300 rows into 300 events and 600 deliveries (half of them to a strict subscription)
    with no node handling more than a few rows per change: a join of two of its CTEs,
    each estimated at one row, ran as a nested loop of 9,500 by 9,500 rows (10.6 s). With
    `room` for every delivery (a quiet queue), none is leased either: leasing is for small
    batches, whose joins stay small."""
    subscription(conn)
    strict = subscription(conn)
    conn.execute("UPDATE webhooks.subscriptions SET ordering = 'strict' WHERE id = %s",
                 (strict,))
    if built_on == "analysed empty":
        conn.execute("ANALYZE webhooks.deliveries, webhooks.events, webhooks.outbox")
    queue_settings(conn)
    lease = claim_params(limit=room, per_target=room, busy={}, lease=60.0, scan=100)
    fanout = prepare(conn, "fanout", dict(fanout_params(100, 1_000_000, lease=lease)))
    conn.execute(fanout)  # the generic plan is built here (force_generic_plan)
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'F' || g, 'c', 1 FROM generate_series(1, 300) g")
    row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + fanout).fetchone()
    assert row is not None
    assert most_rows(row[0][0]["Plan"])[0] <= 10 * 300, most_rows(row[0][0]["Plan"])
    assert conn.execute("SELECT count(*), count(*) FILTER (WHERE next_attempt_at = 'infinity'),"
                        " count(*) FILTER (WHERE attempts = 1 AND subscription_id <> %s)"
                        " FROM webhooks.deliveries", (strict,)).fetchone() == (600, 299, 0)
    generic = conn.execute("SELECT generic_plans FROM pg_prepared_statements"
                           " WHERE name = 'fanout'").fetchone()
    assert generic is not None and generic[0] >= 1


@pytest.mark.parametrize("built_on", ["analysed empty", "never analysed"])
def test_record_plan_holds_whatever_the_statistics(conn: psycopg.Connection,
                                                   built_on: str) -> None:
    """The same for the recorder's statement: its generic plan, built while the day's
    partition was empty, records a batch of a 3,000 backlog touching only the batch."""
    sid = subscription(conn)
    if built_on == "analysed empty":
        conn.execute("ANALYZE webhooks.deliveries, webhooks.events, webhooks.attempts")
    queue_settings(conn)
    record = prepare(conn, "record", {"batch": "[]"})
    conn.execute(record)  # the generic plan is built here
    backlog(conn, sid, 3000)
    batch = conn.execute(
        "SELECT jsonb_agg(jsonb_build_array(id, attempts, subscription_id, 200, 'succeeded',"
        " 0, extract(epoch FROM now()), 1.5, NULL, created_at) ORDER BY id)::text"
        "  FROM (SELECT * FROM webhooks.deliveries ORDER BY id LIMIT 100) d").fetchone()
    assert batch is not None
    record = record.replace("'[]'", psycopg.sql.quote(batch[0]))
    row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + record).fetchone()
    assert row is not None
    assert most_rows(row[0][0]["Plan"])[0] <= 100, most_rows(row[0][0]["Plan"])
    assert conn.execute("SELECT count(*) FROM webhooks.deliveries"
                        " WHERE status = 'succeeded'").fetchone() == (100,)


async def test_the_worker_queue_runs_on_generic_plans(db_url: str,
                                                     conn: psycopg.Connection) -> None:
    """The worker's queue pool has QUEUE_SETTINGS, its other pool the server's; on a
    connection with them, once psycopg has prepared the claim, every claim runs on the
    generic plan."""
    subscription(conn)
    check = ("SELECT current_setting('plan_cache_mode'), current_setting('enable_sort'),"
             " current_setting('enable_seqscan'), current_setting('enable_bitmapscan')")
    async with running_worker(db_url) as worker:
        async with worker.queue.pool.connection() as c:
            queue = await (await c.execute(check)).fetchone()
        async with worker.store.pool.connection() as c:
            other = await (await c.execute(check)).fetchone()
    assert queue == ("force_generic_plan", "off", "off", "off")
    assert other == ("auto", "on", "on", "on")
    pool = make_pool(db_url, max_size=1, settings=QUEUE_SETTINGS)
    await pool.open(wait=True)
    try:
        for _ in range(8):
            assert await claim(Store(pool), limit=1, per_target=1, busy={}, lease=60.0,
                               scan=1) == []
        async with pool.connection() as c:
            cur = await c.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%%busy_owners%%'")
            plans = await cur.fetchall()
    finally:
        await pool.close()
    assert len(plans) == 1 and plans[0][0] >= 1 and plans[0][1] == 0, plans
