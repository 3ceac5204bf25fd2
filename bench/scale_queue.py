"""Scenarios of the delivery queue and the API at scale (issue 16, "At scale").

- fanout_scale: one change fans out to 10,000 active subscriptions (2,000 with --quick),
  all on the bench receiver; seconds from the commit to the last receipt, against the raw
  client posting as many requests (target ≤ 2 s);
- api_scale: the list of one owner's subscriptions (a page of 100) while
  webhooks.subscriptions holds 100,000 rows of many owners, against the same list with
  only that owner's rows in the table;
- retention: 5,000,000 finished deliveries (500,000 with --quick) past the retention
  pruned as the worker prunes them, while writers insert into an attached table that a
  running worker delivers; the writers' p99 before and during the prune, and its duration.
"""

from __future__ import annotations

from bench import api
from bench.common import (
    PYTHON,
    Result,
    ceiling_result,
    connect,
    create_table,
    insert_rows,
    ratio_result,
    reset_service_state,
    wait_until,
)
from bench.context import Context
from service.api.handshake import new_secret
from tests.support.subscriptions import subscribe_many

PAD = 400  # row padding: deliveries of about 600 bytes, like the raw client's body
FAN_TABLE = "fscale_rows"
# Owners of the fan-out's subscriptions: each owner holds at most half of a worker's slots
# (WEBHOOKS_PER_OWNER_CONCURRENCY), so 10,000 subscriptions of one owner would measure
# that cap, not the fan-out.
FAN_OWNERS = 100


def fanout_scale(ctx: Context) -> list[Result]:
    """Seconds from the commit of one row to the last of its 10,000 deliveries."""
    n = 2_000 if ctx.quick else 10_000
    timeout = 60.0 if ctx.quick else 90.0
    raw = ctx.raw("burst", "--url", ctx.target("raw"), "--count", str(n),
                  "--concurrency", "64", timeout=120)
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, FAN_TABLE, attach=FAN_TABLE, pad=PAD)
        subscribe_many(conn, n, resource=FAN_TABLE, events=[f"{FAN_TABLE[:-1]}.create"],
                       owners=FAN_OWNERS, owner="fan", tenant="tenant",
                       target=ctx.target("fscale"), secret=new_secret())
        conn.execute("ANALYZE webhooks.subscriptions")
        conn.execute("ANALYZE webhooks.subscription_events")
        ctx.reset_receiver()
        seconds: list[float] = []
        first: list[float] = []
        with ctx.worker() as worker:
            mark = ctx.cpu_mark(worker)
            # Round 1 is cold (the worker opens its connections), round 2 warm.
            for _ in range(2):
                committed = insert_rows(conn, FAN_TABLE, 1)
                got = ctx.wait_count("fscale", n, timeout)
                if got < n:
                    raise RuntimeError(f"only {got} of {n} deliveries arrived in "
                                       f"{timeout:g}s")
                stats = ctx.stats()["fscale"]
                seconds.append(stats["last"] - committed)
                first.append(stats["first"] - committed)
                ctx.reset_receiver()
            cpu = ctx.cpu_note(worker, mark, 2 * n)
        conn.execute("TRUNCATE webhooks.outbox, webhooks.attempts, webhooks.deliveries, "
                     "webhooks.events")
        conn.execute("DELETE FROM webhooks.subscriptions WHERE resource = %s", (FAN_TABLE,))
        conn.execute(f"DROP TABLE {FAN_TABLE}")
    return [ceiling_result(
        f"fan-out: 1 row → {n:,} subscriptions", seconds[1], raw["seconds"], "s", 2.0,
        f"commit→last receipt, warm worker ({n / seconds[1]:,.0f} deliveries/s; commit→first "
        f"{first[1]:.2f}s); cold (first event after start) {seconds[0]:.2f}s; "
        f"{FAN_OWNERS} owners of {n // FAN_OWNERS} subscriptions each; {cpu}; "
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
