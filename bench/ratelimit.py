"""rate_limit: a rate-limited subscription's deliveries with two workers, beside its limit.

One subscription with `rate_limit` RATE gets a backlog of BACKLOG rows, a second one
without a limit gets the same rows; two worker processes deliver both. The receiver's
count of the limited subscription is sampled every SAMPLE s: the table shows its rate over
the whole drain against the limit, and the notes the most it got in any 10 s and any 1 s
(the promise: at most 10% over in any 10 s, bursts of at most one second's worth) and how
long the unlimited subscription's backlog took (a limited backlog delays no other).
"""

from __future__ import annotations

import time

from bench.common import (
    Result,
    ceiling_result,
    connect,
    create_table,
    insert_rows,
    reset_service_state,
    subscribe,
)
from bench.context import Context
from bench.delivery import PAD
from bench.load import workers

RATE = 100
SAMPLE = 0.1


def _most_in(samples: list[tuple[float, int]], window: float) -> int:
    """The most receipts in any `window` seconds of the (time, count) samples."""
    most, start = 0, 0
    for end in range(len(samples)):
        while samples[end][0] - samples[start][0] > window:
            start += 1
        most = max(most, samples[end][1] - samples[start][1])
    return most


def scenario(ctx: Context) -> list[Result]:
    """The limited subscription's deliveries/s against its limit, two workers."""
    backlog = 1_000 if ctx.quick else 3_000
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, "rl_rows", attach="rl_rows", pad=PAD)
        [limited] = subscribe(conn, "rl_rows", [ctx.target("rl_limited")])
        subscribe(conn, "rl_rows", [ctx.target("rl_free")])
        conn.execute("UPDATE webhooks.subscriptions SET rate_limit = %s WHERE id = %s",
                     (RATE, limited))
        ctx.reset_receiver()
        with workers(ctx, 2):
            started = time.monotonic()
            insert_rows(conn, "rl_rows", backlog)
            samples: list[tuple[float, int]] = []
            free_done: float | None = None
            deadline = started + backlog / RATE * 1.5 + 30
            while time.monotonic() < deadline:
                stats = ctx.stats()
                now = time.monotonic()
                count = int(stats.get("rl_limited", {}).get("count", 0))
                samples.append((now, count))
                if free_done is None and stats.get("rl_free", {}).get("count", 0) >= backlog:
                    free_done = now - started
                if count >= backlog:
                    break
                time.sleep(SAMPLE)
    first = next((i for i, (_, c) in enumerate(samples) if c > 0), None)
    if first is None or samples[-1][1] <= 1:
        raise RuntimeError("the limited subscription got nothing")
    got = samples[-1][1] - samples[first][1]
    rate = got / max(samples[-1][0] - samples[first][0], 1e-9)
    ten, one = _most_in(samples, 10.0), _most_in(samples, 1.0)
    done = "not within the run" if free_done is None else f"in {free_done:.1f} s"
    return [ceiling_result(
        "rate limit: a limited subscription's deliveries/s, two workers", rate, RATE,
        "req/s", RATE * 1.1,
        f"rate_limit {RATE}/s, {backlog:,} rows queued at once, two worker processes; "
        f"at most {ten:,} in any 10 s ({ten / (10 * RATE):.2f}x of 10 s worth) and {one:,} "
        f"in any 1 s ({one / RATE:.2f}x, sampled every {SAMPLE:g} s); an unlimited "
        f"subscription's {backlog:,} deliveries of the same rows done {done}")]
