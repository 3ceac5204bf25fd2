"""Scenarios of one busy subscription, latency under a steady load, and more processes.

- burst_one: one subscription receives a burst of 20,000 events (3,000 quick), captured
  by 100-row INSERTs while the worker runs: deliveries/s from first to last receipt versus
  the raw POST ceiling measured in the same run; the attempts must start in event order;
- latency_load: commit-to-receipt p50/p99 at 200 single-row commits/s on a table attached
  with tenant and user columns (a tenant's subscription), on a fresh worker and again
  right after that worker drained a 20,000-event backlog, beside raw POST round trips;
  then single rows each committed after 0.05 to 10 s of quiet (lone events);
- workers_two: the throughput burst (8 subscriptions) drained by two worker processes
  against one database versus one, with the machine's core count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.abc import Query

from bench.common import (
    Proc,
    Result,
    connect,
    cpu_result,
    create_table,
    info_result,
    insert_rows,
    percentile,
    ratio_result,
    reset_service_state,
    subscribe,
    wait_until,
)
from bench.context import Context
from bench.delivery import PAD, SUBSCRIPTIONS, measure_drain, receipt_rate
from tests.support.subscriptions import subscribe as subscribe_one

STATEMENT_ROWS = 100  # rows per INSERT of a burst
PER_SECOND = 200.0  # the latency scenarios' commit rate
TENANT = "tenant-1"


def insert_burst(conn: psycopg.Connection[Any], table: str, rows: int) -> float:
    """Inserts `rows` rows in 100-row statements, each its own transaction; returns the
    wall-clock time right after the last commit."""
    done = time.time()
    for start in range(0, rows, STATEMENT_ROWS):
        done = insert_rows(conn, table, min(STATEMENT_ROWS, rows - start))
    return done


def start_order(conn: psycopg.Connection[Any], subscription_id: int) -> tuple[int, int]:
    """(first attempts, those that started before an earlier event's): the order check."""
    row = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE attempted_at < before) FROM ("
        " SELECT a.attempted_at, max(a.attempted_at) OVER (ORDER BY d.event_id"
        "   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before"
        "   FROM webhooks.attempts a JOIN webhooks.deliveries d ON d.id = a.delivery_id"
        "  WHERE a.subscription_id = %s AND a.attempt = 1) x", (subscription_id,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def recorded(conn: psycopg.Connection[Any], subscription_id: int) -> int:
    """First attempts recorded so far for the subscription."""
    row = conn.execute("SELECT count(*) FROM webhooks.attempts WHERE subscription_id = %s "
                       "AND attempt = 1", (subscription_id,)).fetchone()
    return int(row[0]) if row else 0


def burst_one(ctx: Context) -> list[Result]:
    """One subscription, a 20,000-event burst: rate versus raw POSTs, and start order."""
    total = 3_000 if ctx.quick else 20_000
    limit, how = ctx.raw_rate()
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, "one_rows", attach="one_rows", pad=PAD)
        (sid,) = subscribe(conn, "one_rows", [ctx.target("one")])
        ctx.reset_receiver()
        with ctx.worker() as worker:
            mark = ctx.cpu_mark(worker)
            started = time.time()
            committed = insert_burst(conn, "one_rows", total)
            rate, notes = measure_drain(ctx, "one", total, 60 if ctx.quick else 180)
            count, _, _, last = receipt_rate(ctx, "one")
            cpu = ctx.cpu_note(worker, mark, count)
            cpu_us = ctx.cpu_us(worker, mark, count)
            wait_until(lambda: recorded(conn, sid) >= count, 30)
        attempts, out_of_order = start_order(conn, sid)
    result = ratio_result(
        "burst: one subscription, deliveries/s", rate, limit, "req/s", 0.5,
        notes + f"{count:,} deliveries to one subscription from {total // STATEMENT_ROWS} "
        f"100-row INSERTs (all committed {committed - started:.1f}s after the first), "
        f"first→last receipt; start→last {count / max(last - started, 1e-9):,.0f}/s; "
        f"start order: {out_of_order} of {attempts:,} first attempts began before an "
        f"earlier event's; {cpu}; limit = {how}")
    result.target += ", start order kept"
    if out_of_order and result.met:
        result.met = False
    return [result, cpu_result("burst: worker CPU per delivery", cpu_us, ctx.raw_cpu_us(),
                               f"{count:,} deliveries to one subscription; ")]


def create_tenant_table(conn: psycopg.Connection[Any], table: str) -> None:
    """(Re)creates public.<table> with tenant and user columns, attached with both."""
    ident = sql.Identifier(table)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(ident))
    conn.execute(sql.SQL(
        "CREATE TABLE {} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
        "tenant_id text NOT NULL, updated_by text, a integer, b text, "
        "pad text DEFAULT {})").format(ident, sql.Literal("x" * PAD)))
    conn.execute("SELECT webhooks.attach(%s::regclass, resource => %s, noun => %s, "
                 "user_column => 'updated_by', tenant_column => 'tenant_id')",
                 (f"public.{table}", table, table.rstrip("s")))


def paced_latency(ctx: Context, conn: psycopg.Connection[Any], table: str, seconds: float
                  ) -> tuple[list[float], int, float]:
    """Commits single rows at PER_SECOND for `seconds`; returns (commit→receipt ms of
    each row that arrived, rows committed, seconds the writer fell behind its pace)."""
    ctx.reset_receiver()
    commits: dict[int, float] = {}
    n = int(seconds * PER_SECOND)
    query = sql.SQL("INSERT INTO {} (tenant_id, updated_by, a, b) VALUES (%s, 'bench', %s, "
                    "'x') RETURNING id").format(sql.Identifier(table))
    start = time.perf_counter()
    with conn.cursor() as cur:
        for i in range(n):
            delay = start + i / PER_SECOND - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            cur.execute(query, (TENANT, i))
            row = cur.fetchone()
            commits[row[0] if row else -1] = time.time()  # autocommit: committed
    behind = time.perf_counter() - start - seconds
    ctx.wait_count("lat", n, 30)
    return [(t - commits[i]) * 1000.0 for i, t in ctx.times() if i in commits], n, behind


def _latency_rows(label: str, lat: list[float], n: int, behind: float,
                  raw: dict[str, Any], extra: str) -> list[Result]:
    if not lat:
        raise RuntimeError(f"{label}: no delivery arrived")
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    notes = (f"{len(lat):,} of {n:,} rows; p95 {percentile(lat, 95):.1f} ms, max "
             f"{max(lat):.1f} ms; raw POST p50 {raw['p50']:.2f} ms, p99 {raw['p99']:.2f} ms"
             + (f"; {n - len(lat)} never arrived" if n > len(lat) else "")
             + (f"; writer fell {behind:.1f}s behind pace" if behind > 0.5 else "")
             + (f"; {extra}" if extra else ""))
    ratio = p50 / raw["p50"] if raw["p50"] else None
    return [
        Result(f"latency {label}: p50", p50, raw["p50"], "ms", "≤ 3x raw p50",
               None if ratio is None else ratio <= 3.0, ratio, notes),
        Result(f"latency {label}: p99", p99, raw["p99"], "ms", "≤ 25 ms", p99 <= 25.0,
               p99 / raw["p99"] if raw["p99"] else None,
               "limit = raw aiohttp POST round trip at the same pace"),
    ]


def latency_load(ctx: Context) -> list[Result]:
    """Latency at 200 commits/s on a tenant table: fresh worker, then after a backlog."""
    seconds = 5.0 if ctx.quick else 15.0
    backlog = 3_000 if ctx.quick else 20_000
    raw = ctx.raw("latency", "--url", ctx.target("raw"), "--per-second", str(PER_SECOND),
                  "--duration", "2" if ctx.quick else "5")
    table = "tenant_rows"
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_tenant_table(conn, table)
        subscribe_one(conn, ctx.target("lat"), resource=table, tenant=TENANT,
                      events=[f"{table.rstrip('s')}.create"], owner="bench")
        ctx.reset_receiver()
        with ctx.worker() as worker:
            mark = ctx.cpu_mark(worker)
            fresh, n, behind = paced_latency(ctx, conn, table, seconds)
            cpu = ctx.cpu_note(worker, mark, len(fresh))
            # The backlog: as many events of the same subscription, in 100-row statements.
            ctx.reset_receiver()
            drain_start = time.time()
            insert = sql.SQL("INSERT INTO {} (tenant_id, updated_by, a, b) SELECT %s, "
                             "'bench', g, 'x' FROM generate_series(1, %s) g").format(
                                 sql.Identifier(table))
            for _ in range(backlog // STATEMENT_ROWS):
                conn.execute(insert, (TENANT, STATEMENT_ROWS))
            got = ctx.wait_count("lat", backlog, 120)
            drained = time.time() - drain_start
            after, n2, behind2 = paced_latency(ctx, conn, table, seconds)
            gaps = QUIET_QUICK if ctx.quick else QUIET
            lone = lone_events(ctx, conn, table, gaps)
    # The same quiet before raw POSTs: an idle machine's first round trip (processes and
    # caches woken) is several times a paced one's.
    quiet = ctx.raw("quiet", "--url", ctx.target("raw"), "--gaps", ",".join(map(str, gaps)),
                    timeout=60.0 + 2 * sum(gaps))
    return (_latency_rows("at 200/s, tenant table, fresh worker", fresh, n, behind, raw,
                          cpu)
            + _latency_rows("at 200/s right after a backlog", after, n2, behind2, raw,
                            f"{got:,} of {backlog:,} backlog events drained in "
                            f"{drained:.1f}s first")
            + [_lone_row(lone, quiet, raw)])


# Quiet before each lone event, in seconds (each gap twice).
QUIET = (0.05, 0.5, 2.0, 5.0, 10.0)
QUIET_QUICK = (0.05, 0.5, 2.0)


def lone_events(ctx: Context, conn: psycopg.Connection[Any], table: str,
                gaps: tuple[float, ...]) -> list[tuple[float, float]]:
    """One row committed after each quiet gap (nothing else happening): (gap, commit→
    receipt ms) of each, the common case of a small installation."""
    query = sql.SQL("INSERT INTO {} (tenant_id, updated_by, a, b) VALUES (%s, 'bench', 0, "
                    "'x') RETURNING id").format(sql.Identifier(table))
    out: list[tuple[float, float]] = []
    for gap in (g for g in gaps for _ in range(2)):
        ctx.reset_receiver()
        time.sleep(gap)  # the quiet being measured, not a wait for a result
        out.append((gap, receipt_ms(ctx, conn, query, (TENANT,),
                                    f"a lone event after {gap:g}s of quiet")))
    return out


def receipt_ms(ctx: Context, conn: psycopg.Connection[Any], query: Query,
               params: tuple[Any, ...], what: str) -> float:
    """Commits one row (`query` returns its id; the connection is in autocommit) and
    waits for its delivery to the receiver's /lat group (reset before): commit to
    receipt, in ms."""
    row = conn.execute(query, params).fetchone()
    committed = time.time()
    if ctx.wait_count("lat", 1, 10) < 1 or row is None:
        raise RuntimeError(f"{what} never arrived")
    return (dict(ctx.times())[row[0]] - committed) * 1000.0


def _lone_row(lone: list[tuple[float, float]], quiet: dict[str, Any],
              raw: dict[str, Any]) -> Result:
    ms = [m for _, m in lone]
    raw_ms = [float(m) for _, m in quiet["samples"]]
    p50, limit = percentile(ms, 50), percentile(raw_ms, 50)
    ratio = p50 / limit if limit else None
    each = ", ".join(f"{g:g}s {m:.1f}" for g, m in lone)
    raw_each = ", ".join(f"{g:g}s {m:.2f}" for g, m in quiet["samples"])
    return Result("latency: one lone event after quiet, p50", p50, limit, "ms",
                  "≤ 3x raw p50", None if ratio is None else ratio <= 3.0, ratio,
                  f"{len(lone)} single-row commits, each after a quiet gap, commit→receipt "
                  f"ms: {each}; max {max(ms):.1f} ms; limit = a raw aiohttp POST after the "
                  f"same quiet, p50 (an idle machine's round trip; paced at 200/s it is "
                  f"{raw['p50']:.2f} ms), each: {raw_each}")


@contextmanager
def workers(ctx: Context, count: int) -> Iterator[list[Proc]]:
    """`count` worker processes on the bench database, stopped when the block ends."""
    with ExitStack() as stack:
        yield [stack.enter_context(ctx.worker()) for _ in range(count)]


def _drain_with(ctx: Context, count: int, table: str, rows: int) -> tuple[float, str]:
    with connect(ctx.url) as conn:
        conn.execute("TRUNCATE webhooks.outbox, webhooks.attempts, webhooks.deliveries, "
                     "webhooks.events CASCADE")
        ctx.reset_receiver()
        with workers(ctx, count) as procs:
            marks = [ctx.cpu_mark(p) for p in procs]
            insert_burst(conn, table, rows)
            rate, notes = measure_drain(ctx, "two", rows * SUBSCRIPTIONS,
                                        60 if ctx.quick else 180)
            cpus = "; ".join(ctx.cpu_note(p, m) for p, m in zip(procs, marks, strict=True))
    return rate, notes + cpus


def workers_two(ctx: Context) -> list[Result]:
    """Two worker processes versus one on the same burst (8 subscriptions)."""
    total = 4_000 if ctx.quick else 20_000
    rows = total // SUBSCRIPTIONS
    cores = os.cpu_count() or 1
    limit, how = ctx.raw_rate()
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, "two_rows", attach="two_rows", pad=PAD)
        subscribe(conn, "two_rows", [ctx.target("two", i) for i in range(SUBSCRIPTIONS)])
    one, one_notes = _drain_with(ctx, 1, "two_rows", rows)
    two, two_notes = _drain_with(ctx, 2, "two_rows", rows)
    notes = (f"{total:,} deliveries ({rows:,} rows x {SUBSCRIPTIONS} subs), first→last "
             f"receipt; one worker {one:,.0f}/s ({one_notes}); two workers {two:,.0f}/s "
             f"({two_notes}); raw POST ceiling {limit:,.0f}/s ({how}); {cores} cores "
             "shared by the workers, Postgres, the receiver and this driver")
    if cores < 4:
        return [info_result("workers: two processes vs one, deliveries/s", two, one,
                            "req/s", f"target ≥ 1.6x needs ≥ 4 cores; {notes}")]
    return [ratio_result("workers: two processes vs one, deliveries/s", two, one, "req/s",
                         1.6, notes)]
