"""Scenarios 2-4: one worker process delivering to the receiver process, against raw POSTs.

- throughput: deliveries/s of N captured events to 8 subscriptions, versus the best raw
  aiohttp POST rate to the same receiver (httpx.AsyncClient shown for reference);
- latency: commit-to-receipt percentiles at 200 rows/s paced, versus raw POST round trips;
- fan-out: one row to 1,000 subscriptions, versus the raw client posting 1,000 requests.
"""

from __future__ import annotations

import time

from bench.common import (
    Result,
    ceiling_result,
    connect,
    cpu_result,
    create_table,
    info_result,
    insert_rows,
    percentile,
    ratio_result,
    reset_service_state,
    subscribe,
)
from bench.context import Context

# Subscriptions of the throughput-like scenarios: enough that the worker's per-target cap
# (WEBHOOKS_PER_TARGET_CONCURRENCY, 8) does not bind below its total concurrency (64).
SUBSCRIPTIONS = 8
PAD = 400  # row padding: deliveries of about 600 bytes, like the raw client's body


def receipt_rate(ctx: Context, group: str) -> tuple[int, float | None, float, float]:
    """(count, receipts/s from first to last receipt, first, last) of a receiver group."""
    g = ctx.stats().get(group)
    if not g or g["count"] < 2 or g["last"] <= g["first"]:
        return (int(g["count"]) if g else 0), None, 0.0, 0.0
    return int(g["count"]), (g["count"] - 1) / (g["last"] - g["first"]), g["first"], g["last"]


def measure_drain(ctx: Context, group: str, expected: int, timeout: float
                  ) -> tuple[float, str]:
    """Waits for `expected` receipts in `group`; returns (rate, notes); raises if none."""
    got = ctx.wait_count(group, expected, timeout)
    count, rate, _, _ = receipt_rate(ctx, group)
    if rate is None:
        raise RuntimeError(f"only {count} of {expected} deliveries arrived")
    notes = "" if got >= expected else f"only {got} of {expected} arrived in {timeout:g}s; "
    return rate, notes


def throughput(ctx: Context) -> list[Result]:
    """Deliveries/s of one worker versus the raw aiohttp POST ceiling (and httpx, for scale)."""
    total = 3_000 if ctx.quick else 20_000
    rows = total // SUBSCRIPTIONS
    limit, how = ctx.raw_rate()
    seconds = "1" if ctx.quick else "2"
    httpx_rates = {c: ctx.raw("rate", "--url", ctx.target("raw"), "--lib", "httpx",
                              "--concurrency", str(c), "--duration", seconds)["rate"]
                   for c in ((16,) if ctx.quick else (16, 64))}
    # The worker's own HTTP client alone, no database: what sending costs of a delivery.
    curl = ctx.raw("rate", "--url", ctx.target("raw"), "--lib", "curl", "--loop", "uvloop",
                   "--concurrency", "32", "--duration", seconds)
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, "thr_rows", attach="thr_rows", pad=PAD)
        subscribe(conn, "thr_rows", [ctx.target("thr", i) for i in range(SUBSCRIPTIONS)])
        ctx.reset_receiver()
        with ctx.worker() as worker:
            mark = ctx.cpu_mark(worker)
            committed = insert_rows(conn, "thr_rows", rows)
            rate, notes = measure_drain(ctx, "thr", rows * SUBSCRIPTIONS,
                                        60 if ctx.quick else 180)
            count, _, first, last = receipt_rate(ctx, "thr")
            cpu = ctx.cpu_note(worker, mark, count)
            cpu_us = ctx.cpu_us(worker, mark, count)
    end_to_end = count / (last - committed) if last > committed else 0.0
    raw_all = ", ".join(f"{k} {v:,.0f}" for k, v in ctx.cache.get("raw_rates", {}).items())
    results = [
        ratio_result("throughput: deliveries/s, one worker", rate, limit, "req/s", 0.6,
                     notes + f"{count:,} deliveries ({rows:,} rows x {SUBSCRIPTIONS} subs), "
                     f"first→last receipt; commit→first {first - committed:.2f}s (fan-out), "
                     f"commit→last {end_to_end:,.0f}/s; {cpu}; "
                     f"limit = {how}; raw aiohttp: "
                     f"{raw_all}"),
        cpu_result("throughput: worker CPU per delivery", cpu_us, ctx.raw_cpu_us(),
                   f"{count:,} deliveries to {SUBSCRIPTIONS} subscriptions; "),
        info_result("throughput: the worker's HTTP client alone (reference)", curl["rate"],
                    limit, "req/s",
                    f"service.curl (libcurl's multi interface) posting the same body, "
                    f"uvloop c=32, no database: {curl['cpu_us']:.0f} us CPU/request against "
                    f"{ctx.raw_cpu_us() or 0:.0f} for the raw aiohttp limit and "
                    f"{cpu_us:.0f} for the worker's whole delivery"),
        info_result("throughput: raw httpx.AsyncClient (reference)", max(httpx_rates.values()),
                    limit, "req/s", "httpx's own transport: "
                    + ", ".join(f"c={c} {r:,.0f}" for c, r in httpx_rates.items())),
    ]
    return results


def latency(ctx: Context) -> list[Result]:
    """Commit-to-receipt p50/p99 at 200 rows/s paced, versus raw POST round trips."""
    seconds = 5.0 if ctx.quick else 20.0
    per_second = 200.0
    raw = ctx.raw("latency", "--url", ctx.target("raw"), "--per-second", str(per_second),
                  "--duration", "2" if ctx.quick else "5")
    commits: dict[int, float] = {}
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, "lat_rows", attach="lat_rows", pad=PAD)
        subscribe(conn, "lat_rows", [ctx.target("lat")])
        with ctx.worker() as worker:
            # Warm-up: the worker's pools and connections open before the clock starts.
            insert_rows(conn, "lat_rows", 1)
            ctx.wait_count("lat", 1, 15)
            ctx.reset_receiver()
            mark = ctx.cpu_mark(worker)
            n = int(seconds * per_second)
            start = time.perf_counter()
            with conn.cursor() as cur:
                for i in range(n):
                    delay = start + i / per_second - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    cur.execute("INSERT INTO lat_rows (a, b) VALUES (%s, 'x') RETURNING id",
                                (i,))
                    row = cur.fetchone()
                    # Autocommit: the statement has committed when execute returns.
                    commits[row[0] if row else -1] = time.time()
            behind = time.perf_counter() - start - seconds
            ctx.wait_count("lat", n, 30)
            times = ctx.times()
            cpu = ctx.cpu_note(worker, mark, len(times))
    lat = [(t - commits[i]) * 1000.0 for i, t in times if i in commits]
    if not lat:
        raise RuntimeError("no delivery arrived")
    missing = n - len(lat)
    notes = (f"{len(lat):,} of {n:,} rows in {seconds:g}s; p95 {percentile(lat, 95):.1f} ms, "
             f"max {max(lat):.1f} ms; raw POST p95 {raw['p95']:.2f} ms"
             + (f"; {missing} never arrived" if missing else "")
             + (f"; writer fell {behind:.1f}s behind pace" if behind > 0.5 else ""))
    return [
        ceiling_result("latency: commit→receipt p50", percentile(lat, 50), raw["p50"], "ms",
                       5, notes),
        ceiling_result("latency: commit→receipt p99", percentile(lat, 99), raw["p99"], "ms",
                       25, f"limit = raw aiohttp POST round trip at the same pace; {cpu}"),
    ]


def fanout(ctx: Context) -> list[Result]:
    """Seconds from the commit of one row to the last of its 1,000 deliveries."""
    n = 1000
    raw = ctx.raw("burst", "--url", ctx.target("raw"), "--count", str(n),
                  "--concurrency", "64")
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, "fan_rows", attach="fan_rows", pad=PAD)
        subscribe(conn, "fan_rows", [ctx.target("fan", i) for i in range(n)])
        ctx.reset_receiver()
        seconds: list[float] = []
        with ctx.worker():
            # Round 1 is cold (the worker opens its connections), round 2 warm.
            for _ in range(2):
                committed = insert_rows(conn, "fan_rows", 1)
                got = ctx.wait_count("fan", n, 30)
                if got < n:
                    raise RuntimeError(f"only {got} of {n} deliveries arrived in 30s")
                seconds.append(ctx.stats()["fan"]["last"] - committed)
                ctx.reset_receiver()
    return [ceiling_result("fan-out: 1 row → 1,000 subscriptions", seconds[1], raw["seconds"],
                           "s", 1.0, f"commit→last receipt, warm worker; cold (first "
                           f"event after start) {seconds[0]:.2f}s; limit = raw aiohttp "
                           "posting 1,000 requests at c=64")]
