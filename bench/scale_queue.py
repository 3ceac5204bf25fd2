"""Scenarios of the delivery queue and the API at scale (issue 16, "At scale").

- fanout_scale: one change fans out to 10,000 active subscriptions (2,000 with --quick),
  all on the bench receiver; seconds from the commit to the last receipt, against the raw
  client posting as many requests (target: at most 1.5 times the raw client's time);
- api_scale: the list of one owner's subscriptions (a page of 100) while
  webhooks.subscriptions holds 100,000 rows of many owners, against the same list with
  only that owner's rows in the table;
- retention: 5,000,000 finished deliveries (500,000 with --quick) past the retention
  pruned as the worker prunes them, while writers insert into an attached table that a
  running worker delivers; the writers' p99 before and during the prune, and its duration.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg

from bench import api
from bench.common import (
    PYTHON,
    Result,
    connect,
    create_table,
    info_result,
    insert_rows,
    median,
    percentile,
    ratio_result,
    reset_service_state,
    subscribe,
    wait_until,
)
from bench.context import Context
from service.api.handshake import new_secret
from service.config import Settings
from service.store import Store, make_pool
from service.worker import pruning
from tests.support.subscriptions import subscribe_many

PAD = 400  # row padding: deliveries of about 600 bytes, like the raw client's body
FAN_TABLE = "fscale_rows"
# Owners of the fan-out's subscriptions: the per-owner cap (WEBHOOKS_PER_OWNER_CONCURRENCY)
# bounds one owner's share of a worker's slots, so 10,000 subscriptions of one owner
# would measure that cap, not the fan-out.
FAN_OWNERS = 100


def fanout_scale(ctx: Context) -> list[Result]:
    """Seconds from the commit of one row to the last of its 10,000 deliveries: a cold
    round (the worker's first event), then warm rounds, each right after the raw client
    posts as many requests (the ratio is the median of those pairs' ratios: one pair on a
    shared 2-core machine moves by a third from run to run)."""
    n = 2_000 if ctx.quick else 10_000
    rounds = 1 if ctx.quick else 3
    timeout = 60.0 if ctx.quick else 90.0
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, FAN_TABLE, attach=FAN_TABLE, pad=PAD)
        subscribe_many(conn, n, resource=FAN_TABLE, events=[f"{FAN_TABLE[:-1]}.create"],
                       owners=FAN_OWNERS, owner="fan", tenant="tenant",
                       target=ctx.target("fscale"), secret=new_secret())
        conn.execute("ANALYZE webhooks.subscriptions")
        conn.execute("ANALYZE webhooks.subscription_events")
        ctx.reset_receiver()

        def one_round() -> tuple[float, float]:
            """(commit → last receipt, commit → first receipt) of one row's fan-out."""
            committed = insert_rows(conn, FAN_TABLE, 1)
            got = ctx.wait_count("fscale", n, timeout)
            if got < n:
                raise RuntimeError(f"only {got} of {n} deliveries arrived in {timeout:g}s")
            stats = ctx.stats()["fscale"]
            ctx.reset_receiver()
            return stats["last"] - committed, stats["first"] - committed

        seconds: list[float] = []
        raws: list[float] = []
        first = 0.0
        with ctx.worker() as worker:
            cold, _ = one_round()  # the worker opens its connections
            for _ in range(rounds):
                raw = ctx.raw("burst", "--url", ctx.target("raw"), "--count", str(n),
                              "--concurrency", "64", timeout=120)
                raws.append(raw["seconds"])
                ctx.reset_receiver()
                mark = ctx.cpu_mark(worker)
                warm, first = one_round()
                seconds.append(warm)
            cpu = ctx.cpu_note(worker, mark, n)
        conn.execute("TRUNCATE webhooks.outbox, webhooks.attempts, webhooks.deliveries, "
                     "webhooks.events")
        conn.execute("DELETE FROM webhooks.subscriptions WHERE resource = %s", (FAN_TABLE,))
        conn.execute(f"DROP TABLE {FAN_TABLE}")
    ratio = median([s / r for s, r in zip(seconds, raws, strict=True) if r]) if all(raws) \
        else None
    service, limit = median(seconds), median(raws)
    pairs = ", ".join(f"{s:.2f}/{r:.2f}" for s, r in zip(seconds, raws, strict=True))
    return [Result(
        f"fan-out: 1 row → {n:,} subscriptions", service, limit, "s",
        "≤ 1.5x raw", None if ratio is None else ratio <= 1.5, ratio,
        f"commit→last receipt, warm worker, median of {rounds} rounds each right after the "
        f"raw client's (service/raw s: {pairs}; ratio = median of their ratios; "
        f"{n / service:,.0f} deliveries/s; commit→first {first:.2f}s in the last); cold "
        f"(first event after start) {cold:.2f}s; {FAN_OWNERS} owners of "
        f"{n // FAN_OWNERS} subscriptions each; last round: {cpu}; "
        f"limit = raw aiohttp posting {n:,} requests at c=64")]


API_TABLE = "apiscale_rows"
API_OWNER = "bench"  # the owner of bench.api's token
API_OWN = 1_000  # that owner's subscriptions: ten pages of 100


def _seed_subscriptions(ctx: Context, total: int, every: int) -> None:
    """Empties webhooks.subscriptions and inserts `total` subscriptions, every `every`-th
    one of API_OWNER (spread over the table, as when many owners subscribe over time),
    the others of 997 other owners."""
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        conn.execute(
            "INSERT INTO webhooks.subscriptions (owner, resource, events, target, secret)"
            " SELECT CASE WHEN i %% %(every)s = 0 THEN %(owner)s ELSE 'owner' || (i %% 997)"
            " END, %(resource)s, %(events)s, %(target)s || i, %(secret)s"
            " FROM generate_series(1, %(total)s) AS i",
            {"every": every, "owner": API_OWNER, "resource": API_TABLE,
             "events": [f"{API_TABLE[:-1]}.create", f"{API_TABLE[:-1]}.update"],
             "target": ctx.target("apiscale") + "/", "secret": new_secret(), "total": total})
        row = conn.execute("SELECT count(*) FILTER (WHERE owner = %s), count(*)"
                           " FROM webhooks.subscriptions", (API_OWNER,)).fetchone()
        if not row or row[0] != API_OWN:
            raise RuntimeError(f"seeding gave {row} subscriptions, not {API_OWN} of the owner")
        conn.execute("VACUUM ANALYZE webhooks.subscriptions")
        conn.execute("VACUUM ANALYZE webhooks.subscription_events")


def api_scale(ctx: Context) -> list[Result]:
    """The list (a page of 100) of an owner with 1,000 subscriptions among 100,000, against
    the same list with only that owner's subscriptions in the table."""
    crowded = 20_000 if ctx.quick else 100_000
    seconds = 3 if ctx.quick else 10
    with connect(ctx.url) as conn:
        create_table(conn, API_TABLE, attach=API_TABLE)
    token = api._token(ctx)
    port = api.free_port()
    url = f"http://127.0.0.1:{port}/api/v1/webhooks/"
    got: dict[str, api.Load] = {}
    sizes: dict[str, int] = {}
    cpu: dict[str, str] = {}
    with ctx.procs.running_proc("api", [PYTHON, "-m", "service", "api", "--host",
                                        "127.0.0.1", "--port", str(port)],
                                # As in bench.api: the per-token rate limit would measure
                                # itself.
                                env={"DATABASE_URL": ctx.url, "WEBHOOKS_RATE_LIMIT": "0"},
                                profile=ctx.profile_path("api")) as proc:
        if not wait_until(lambda: not proc.alive() or api._healthy(port), 30) \
                or not proc.alive():
            raise RuntimeError(f"the API did not start: {proc.tail()}")
        for case, total in (("alone", API_OWN), ("crowded", crowded)):
            _seed_subscriptions(ctx, total, total // API_OWN)
            sizes[case] = api._size(url, token)
            api.load(ctx, url, 1, token)  # warm-up: pools, caches, plans
            mark = ctx.cpu_mark(proc)
            got[case] = api.load(ctx, url, seconds, token)
            cpu[case] = ctx.cpu_note(proc, mark, int(got[case].rps * seconds))
        with connect(ctx.url) as conn:
            reset_service_state(conn)
            conn.execute(f"DROP TABLE {API_TABLE}")
    alone, many = got["alone"], got["crowded"]
    notes = (f"{many.tool} -t2 -c32 {seconds}s each, GET /api/v1/webhooks/ of owner "
             f"{API_OWNER!r} ({API_OWN:,} subscriptions, every {crowded // API_OWN}th row "
             f"of {crowded:,} of 998 owners; {sizes['crowded']:,}-byte page); limit = the "
             f"same list with only that owner's {API_OWN:,} subscriptions in the table "
             f"({sizes['alone']:,}-byte page); crowded: {cpu['crowded']}; "
             f"alone: {cpu['alone']}")
    p99_ratio = many.p99_ms / alone.p99_ms if alone.p99_ms else None
    return [
        ratio_result(f"api: list, page of 100, among {crowded:,} subscriptions req/s",
                     many.rps, alone.rps, "req/s", 0.9, notes),
        Result(f"api: list, page of 100, among {crowded:,} subscriptions p99",
               many.p99_ms, alone.p99_ms, "ms", "ratio ≤ 1.5",
               None if p99_ratio is None else p99_ratio <= 1.5, p99_ratio,
               "limit = the p99 of the same list alone"),
    ]


RET_TABLE = "ret_rows"  # the writers' attached table, delivered by a running worker
RET_OLD = "ret_old_rows"  # the resource of the old events (nothing writes it)
RET_SUBSCRIPTIONS = 10  # the old deliveries: one per old event and subscription
RET_RETENTION = 7 * 86400.0  # WEBHOOKS_RETENTION's default
RET_DAYS = 20  # the old rows span the 20 days before the retention
WRITES_PER_SECOND = 100.0


def _exists(conn: psycopg.Connection[Any], query: str) -> bool:
    row = conn.execute(query).fetchone()
    return bool(row and row[0])


def _seed_old_deliveries(conn: psycopg.Connection[Any], deliveries: int) -> tuple[float, str]:
    """Inserts `deliveries` finished deliveries (one attempt each) of old events, spread
    over the RET_DAYS days before the retention; returns (seconds, what was done)."""
    started = time.monotonic()
    create_table(conn, RET_OLD, attach=RET_OLD)
    subscribe_many(conn, RET_SUBSCRIPTIONS, resource=RET_OLD,
                   events=[f"{RET_OLD[:-1]}.create"], owner="old", tenant="tenant",
                   secret=new_secret())
    subs = [r[0] for r in conn.execute("SELECT id FROM webhooks.subscriptions"
                                       " WHERE resource = %s ORDER BY id", (RET_OLD,))]
    events = deliveries // len(subs)
    # Event i (0-based) and its deliveries were made at `first + i * step`: ids and times
    # rise together, as fan-out makes them.
    row = conn.execute(
        "SELECT now() - make_interval(secs => %(r)s) - make_interval(days => %(d)s),"
        " (make_interval(days => %(d)s) - interval '1 hour') / %(e)s,"
        " nextval('webhooks.event_ids')",
        {"r": RET_RETENTION, "d": RET_DAYS, "e": events}).fetchone()
    assert row is not None
    first, step, first_id = row
    conn.execute("SELECT setval('webhooks.event_ids', %s)", (first_id + events,))
    did = []
    # Time-partitioned queue tables take rows of a day only once its partition exists.
    if _exists(conn, "SELECT count(*) FROM pg_proc p JOIN pg_namespace n"
                     " ON n.oid = p.pronamespace WHERE n.nspname = 'webhooks'"
                     " AND p.proname = 'ensure_partitions'"):
        made = conn.execute("SELECT webhooks.ensure_partitions(%s::timestamptz - interval"
                            " '1 day', %s::timestamptz + interval '1 day')",
                            (first, first + step * events)).fetchone()
        did.append(f"ensure_partitions made {made[0] if made else '?'} partitions")
    elif _exists(conn, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"):
        # The rows are consistent by construction; checking each one's foreign keys
        # (deliveries to events and subscriptions, attempts to deliveries) would triple
        # the seeding time. The setting skips those checks for this session only.
        conn.execute("SET session_replication_role = replica")
        did.append("foreign key checks skipped while seeding")
    created = _exists(conn, "SELECT count(*) FROM information_schema.columns"
                            " WHERE table_schema = 'webhooks' AND table_name = 'events'"
                            " AND column_name = 'created_at'")
    params = {"first": first, "step": step, "first_id": first_id, "events": events,
              "subs": subs, "n": len(subs), "resource": RET_OLD,
              "name": f"{RET_OLD[:-1]}.create",
              "body": '{"event": {"name": "row.create"}, "resource": {"pad": "'
                      + "x" * 400 + '"}}'}
    conn.execute(
        "INSERT INTO webhooks.events (id, hook_resource, name, tenant, occurred_at, body"
        + (", created_at" if created else "") + ")"
        " SELECT %(first_id)s + i, %(resource)s, %(name)s, NULL,"
        " %(first)s::timestamptz + i * %(step)s::interval, %(body)s"
        + (", %(first)s::timestamptz + i * %(step)s::interval" if created else "") +
        " FROM generate_series(0, %(events)s - 1) AS i", params)
    # Delivery j is of event j / n and subscription j % n; every tenth one failed after
    # its retries, the others succeeded at once.
    conn.execute(
        "INSERT INTO webhooks.deliveries (event_id, subscription_id, status, attempts,"
        " next_attempt_at, created_at, finished_at)"
        " SELECT %(first_id)s + j / %(n)s, (%(subs)s::bigint[])[j %% %(n)s + 1],"
        " CASE WHEN j %% 10 = 9 THEN 'failed' ELSE 'succeeded' END, 1, t.at, t.at,"
        " t.at + interval '1 second'"
        " FROM generate_series(0, %(events)s * %(n)s - 1) AS j,"
        " LATERAL (SELECT %(first)s::timestamptz + (j / %(n)s) * %(step)s::interval)"
        " AS t (at)", params)
    conn.execute(
        "INSERT INTO webhooks.attempts (delivery_id, subscription_id, attempt, attempted_at,"
        " status, duration_ms) SELECT d.id, d.subscription_id, 1, d.finished_at,"
        " CASE WHEN d.status = 'failed' THEN 503 ELSE 200 END, 3.5"
        " FROM webhooks.deliveries d WHERE d.subscription_id = ANY (%(subs)s::bigint[])",
        params)
    conn.execute("RESET session_replication_role")
    seconds = time.monotonic() - started
    # Old rows have long been vacuumed and analysed by the time retention reaches them.
    conn.execute("VACUUM ANALYZE webhooks.events, webhooks.deliveries, webhooks.attempts")
    did.append(f"{events:,} events, {events * len(subs):,} deliveries and attempts over "
               f"{RET_DAYS} days inserted in {seconds:.1f}s, VACUUM ANALYZE "
               f"{time.monotonic() - started - seconds:.1f}s")
    return seconds, "; ".join(did)


def _old_rows(conn: psycopg.Connection[Any]) -> int:
    cutoff = f"now() - make_interval(secs => {RET_RETENTION:.0f})"
    row = conn.execute(f"SELECT (SELECT count(*) FROM webhooks.deliveries WHERE created_at"
                       f" < {cutoff}) + (SELECT count(*) FROM webhooks.events"
                       f" WHERE occurred_at < {cutoff})").fetchone()
    return int(row[0]) if row else 0


class Writers:
    """A thread inserting single rows into RET_TABLE at WRITES_PER_SECOND, each in its own
    transaction; records (start, latency ms) of each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="writers", daemon=True)

    def _run(self) -> None:
        try:
            with connect(self.url) as conn:
                start = time.perf_counter()
                i = 0
                while not self.stop.is_set():
                    delay = start + i / WRITES_PER_SECOND - time.perf_counter()
                    if delay > 0:
                        self.stop.wait(delay)
                    t0 = time.perf_counter()
                    conn.execute(f"INSERT INTO {RET_TABLE} (a, b) VALUES (%s, 'x')", (i,))
                    self.samples.append((t0, (time.perf_counter() - t0) * 1000.0))
                    i += 1
        except BaseException as exc:  # reported by the scenario
            self.error = exc

    def between(self, t0: float, t1: float) -> list[float]:
        """Latencies (ms) of the writes started in [t0, t1] (time.perf_counter())."""
        return [ms for at, ms in list(self.samples) if t0 <= at <= t1]


async def _prune(url: str, budget: float) -> int | None:
    """pruning.prune as the worker calls it; None when it did not finish within `budget`
    seconds (it is cancelled: the batch in progress rolls back)."""
    pool = make_pool(url, min_size=1, max_size=2, name="bench-prune")
    await pool.open(wait=True)
    try:
        # Each statement within the worker's retention deadline (its default).
        store = Store(pool, Settings().maintenance_db_timeout)
        return await asyncio.wait_for(pruning.prune(store, RET_RETENTION), budget)
    except TimeoutError:
        return None
    finally:
        await pool.close()


def retention(ctx: Context) -> list[Result]:
    """Pruning 5,000,000 old finished deliveries while writers run: the writers' p99 before
    and during, and how long the prune takes."""
    n = 500_000 if ctx.quick else 5_000_000
    before_s = 5.0 if ctx.quick else 8.0
    # Partition drops take about a second back to back, and the pruner spaces them (each
    # after 100 times what the last one took: 90-100 s here); a prune by batched DELETEs
    # (as before the queue tables were partitioned) took minutes for 5,000,000 rows. Past
    # the budget the prune is stopped and its rate gives the estimate. The writes of the 2 s
    # after it ends count as "during" too, so that a prune of a few milliseconds still has
    # a sample.
    budget = 60.0 if ctx.quick else 150.0
    after_s = 2.0
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        seed_s, seeded = _seed_old_deliveries(conn, n)
        old = _old_rows(conn)
        create_table(conn, RET_TABLE, attach=RET_TABLE, pad=PAD)
        subscribe(conn, RET_TABLE, [ctx.target("ret")])
        ctx.reset_receiver()
        # The worker's own pruner must not touch the old rows: this scenario prunes.
        with ctx.worker(WEBHOOKS_RETENTION="3650d") as worker:
            writers = Writers(ctx.url)
            writers.thread.start()
            try:
                if not wait_until(lambda: ctx.count("ret") > 0 or writers.error is not None,
                                  30):
                    raise RuntimeError("no write was delivered in 30s")
                t0 = time.perf_counter()
                wait_until(lambda: time.perf_counter() - t0 >= before_s
                           or writers.error is not None, before_s + 5, interval=0.2)
                mark = ctx.cpu_mark(worker)
                p0 = time.perf_counter()
                pruned = asyncio.run(_prune(ctx.url, budget))
                p1 = time.perf_counter()
                cpu = ctx.cpu_note(worker, mark)
                wait_until(lambda: time.perf_counter() - p1 >= after_s
                           or writers.error is not None, after_s + 5, interval=0.1)
                p2 = max(p1, p0 + after_s)
            finally:
                writers.stop.set()
                writers.thread.join(10)
            if writers.error is not None:
                raise RuntimeError(f"the writers failed: {writers.error}")
            written = len(writers.samples)
            delivered = ctx.wait_count("ret", written, 30)
        left = _old_rows(conn)
        conn.execute("TRUNCATE webhooks.outbox")
        reset_service_state(conn)
        conn.execute(f"DROP TABLE {RET_TABLE}, {RET_OLD}")
    before = writers.between(t0, p0)
    during = writers.between(p0, p2)
    if not before or not during:
        raise RuntimeError(f"too few writes: {len(before)} before, {len(during)} during")
    took = p1 - p0
    removed = old - left
    if pruned is None:
        rate = removed / took
        how = (f"stopped after {took:.0f}s (budget), {removed:,} of {old:,} old deliveries "
               f"and events gone ({rate:,.0f} rows/s): all of them would take about "
               f"{old / rate:,.0f}s" if rate else f"nothing removed in {took:.0f}s")
        figure = old / rate if rate else None
    else:
        how = (f"returned {pruned:,}; {old:,} old deliveries and events before, {left:,} "
               f"after ({removed / took:,.0f} rows/s)")
        figure = took
    p99_ratio = percentile(during, 99) / percentile(before, 99)
    notes = (f"{len(before):,} writes before in {p0 - t0:.1f}s, {len(during):,} during "
             f"(and {after_s:g}s after); "
             f"p50 {percentile(before, 50):.2f} → {percentile(during, 50):.2f} ms, max "
             f"{max(before):.1f} → {max(during):.1f} ms; single-row INSERTs at "
             f"{WRITES_PER_SECOND:g}/s on an attached table, each delivered by a running "
             f"worker ({delivered:,} of {written:,} arrived)")
    return [
        Result("retention: writers' p99 while it runs", percentile(during, 99),
               percentile(before, 99), "ms", "ratio ≤ 2", p99_ratio <= 2.0, p99_ratio,
               notes + "; limit = their p99 just before"),
        info_result(f"retention: prune {n:,} old deliveries"
                    + ("" if pruned is not None else " (estimate)"), figure, seed_s, "s",
                    f"pruning.prune as the worker calls it: {how}; limit = inserting "
                    f"them; {seeded}; during the prune: {cpu}"),
    ]
