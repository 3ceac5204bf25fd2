"""Scenarios 5-6: a backlog after an outage, and healthy targets next to hanging ones.

- backlog: 100,000 deliveries (20,000 quick) captured while no worker ran (as after the
  receiver or the worker was down); a worker then drains them: rate versus the raw POST
  ceiling, and the worker's peak RSS;
- isolation: half the subscriptions point at a path that never answers (the delivery
  timeout ends each attempt); the healthy half's throughput versus the same load alone.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import psycopg

from bench.common import (
    Result,
    ceiling_result,
    connect,
    create_table,
    insert_rows,
    median,
    ratio_result,
    reset_service_state,
    subscribe,
    wait_until,
)
from bench.context import Context
from bench.delivery import PAD, SUBSCRIPTIONS, measure_drain, receipt_rate

HANG_TIMEOUT = "2"  # WEBHOOKS_DELIVERY_TIMEOUT of the isolation scenario, seconds


def backlog(ctx: Context) -> list[Result]:
    """Drain rate of a captured backlog versus raw POSTs; the worker's peak RSS."""
    total = 20_000 if ctx.quick else 100_000
    rows = total // SUBSCRIPTIONS
    limit, how = ctx.raw_rate()
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, "backlog_rows", attach="backlog_rows", pad=PAD)
        subscribe(conn, "backlog_rows", [ctx.target("backlog", i) for i in range(SUBSCRIPTIONS)])
        # Captured with no worker running: the whole backlog waits in the outbox.
        for _ in range(rows // 1000):
            insert_rows(conn, "backlog_rows", 1000)
        if rows % 1000:
            insert_rows(conn, "backlog_rows", rows % 1000)
        ctx.reset_receiver()
        with ctx.worker() as worker:
            idle_rss = ctx.rss_mb(worker)
            started, mark = time.time(), ctx.cpu_mark(worker)
            # Quick runs cap the wait: the rate of what arrived by then is still a rate.
            rate, notes = measure_drain(ctx, "backlog", total, 25 if ctx.quick else 600)
            peak = ctx.rss_mb(worker)
            count, _, first, last = receipt_rate(ctx, "backlog")
            cpu = ctx.cpu_note(worker, mark, count)
    overall = count / (last - started) if last > started else 0.0
    return [
        ratio_result("backlog: drain rate", rate, limit, "req/s", 0.6,
                     notes + f"{count:,} deliveries ({rows:,} rows x {SUBSCRIPTIONS} subs) "
                     f"first→last receipt; fan-out before the first: {first - started:.1f}s; "
                     f"worker start→last {overall:,.0f}/s; {cpu}; "
                     f"limit = {how}"),
        ceiling_result("backlog: worker peak RSS", peak, None, "MB", 200,
                       f"VmHWM after draining {count:,} deliveries; "
                       + (f"{idle_rss:.0f} MB when started" if idle_rss else "")),
    ]


def _settled(conn: psycopg.Connection[Any], subscription_ids: list[int]) -> bool:
    """Whether none of these subscriptions' deliveries is pending any more."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM webhooks.deliveries"
                       " WHERE status = 'pending' AND subscription_id = ANY(%s))",
                       (subscription_ids,)).fetchone()
    return row is not None and not row[0]


def isolation(ctx: Context) -> list[Result]:
    """Healthy targets' deliveries/s with as many hanging targets, versus alone: rounds of
    the two, each with subscriptions of its own; the ratio is the median of the rounds'
    (one drain of 8,000 deliveries lasts about a second, which a shared machine's load
    moves by a fifth)."""
    total = 2_000 if ctx.quick else 8_000
    rounds = 1 if ctx.quick else 3
    rows = total // SUBSCRIPTIONS
    timeout = 12 if ctx.quick else 90
    env = {"WEBHOOKS_DELIVERY_TIMEOUT": HANG_TIMEOUT}
    bases: list[float] = []
    rates: list[float] = []
    short: list[str] = []
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, "iso_rows", attach="iso_rows", pad=PAD)
        with ctx.worker(**env):
            for _ in range(rounds):
                alone = subscribe(conn, "iso_rows", [ctx.target("alone", i)
                                                     for i in range(SUBSCRIPTIONS)])
                ctx.reset_receiver()
                insert_rows(conn, "iso_rows", rows)
                base, _ = measure_drain(ctx, "alone", total, timeout)
                conn.execute("UPDATE webhooks.subscriptions SET active = false"
                             " WHERE id = ANY(%s)", (alone,))
                both = subscribe(conn, "iso_rows", [ctx.target("healthy", i)
                                                    for i in range(SUBSCRIPTIONS)])
                both += subscribe(conn, "iso_rows", [ctx.target("hang", i)
                                                     for i in range(SUBSCRIPTIONS)])
                ctx.reset_receiver()
                committed = insert_rows(conn, "iso_rows", rows)
                got = ctx.wait_count("healthy", total, timeout, idle=timeout)
                _, rate, _, _ = receipt_rate(ctx, "healthy")
                if got < total or rate is None:
                    # Unfinished: what arrived over the whole window is the honest rate.
                    rate = got / max(time.time() - committed, 1e-9)
                    short.append(f"only {got:,} of {total:,} healthy deliveries in {timeout}s")
                bases.append(base)
                rates.append(rate)
                # The next round starts once the hanging attempts in flight have timed out
                # and been closed: they would otherwise hold slots during its drain alone.
                conn.execute("UPDATE webhooks.subscriptions SET active = false"
                             " WHERE id = ANY(%s)", (both,))
                wait_until(partial(_settled, conn, both), 4 * float(HANG_TIMEOUT) + 10)
    ratio = median([r / b for r, b in zip(rates, bases, strict=True) if b])
    pairs = ", ".join(f"{r:,.0f}/{b:,.0f}" for r, b in zip(rates, bases, strict=True))
    note = (f"{SUBSCRIPTIONS} healthy + {SUBSCRIPTIONS} hanging subscriptions, "
            f"WEBHOOKS_DELIVERY_TIMEOUT={HANG_TIMEOUT}s, {total:,} healthy deliveries a round; "
            f"limit = the same {SUBSCRIPTIONS} healthy subscriptions alone, just before; "
            f"{rounds} rounds (beside/alone deliveries/s: {pairs}), medians, ratio = median "
            f"of the rounds' ratios")
    if short:
        note = "; ".join(short) + "; " + note
    return [ratio_result("isolation: healthy deliveries/s beside hanging targets",
                         median(rates), median(bases), "req/s", 0.8, note, ratio=ratio)]
