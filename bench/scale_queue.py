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

from bench.common import (
    Result,
    ceiling_result,
    connect,
    create_table,
    insert_rows,
    reset_service_state,
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
