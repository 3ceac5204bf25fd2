"""slow_targets: targets that answer in 200 ms and in 1 s, on many hosts, with defaults.

Real targets are across the internet: they answer in 100 ms to seconds. A receiver
process binds 127.0.1.1 to 127.0.1.HOSTS (one target host each, the same port) and
answers /slow<ms>/... after <ms> milliseconds. SUBSCRIPTIONS subscriptions of OWNERS
owners, their targets spread over the hosts, get one burst of deliveries with bodies of
about 4 KiB; one worker with default settings drains it. Beside it, in the same run, the
raw aiohttp client holds as many requests in flight as the case names (1,000 for 200 ms
answers, 2,000 for 1 s) against the same hosts. Each case prints deliveries/s (first to
last receipt), the raw client's rate and the ratio, the most requests the receiver
answered at once while the worker drained, and the worker's peak RSS.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from typing import Any

from bench.common import (
    PYTHON,
    Result,
    ceiling_result,
    connect,
    create_table,
    info_result,
    insert_rows,
    ratio_result,
    reset_service_state,
    subscribe,
)
from bench.context import Context
from bench.receiver import read_port

HOSTS = 50
OWNERS = 10
SUBSCRIPTIONS = 500
BODY_BYTES = 4096
# (answer after ms, the raw client's requests in flight, deliveries (quick: fewer)).
CASES = ((200, 1000, 20_000, 5_000), (1000, 2000, 20_000, 6_000))


def get_stats(port: int, path: str, method: str = "GET", tls: bool = False) -> Any:
    """A request to a receiver's stats (with `tls`, over https, its certificate unchecked:
    the bench's own receiver)."""
    context = None
    if tls:
        import ssl

        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    scheme = "https" if tls else "http"
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{port}{path}", method=method)
    with urllib.request.urlopen(req, timeout=10, context=context) as resp:
        data = resp.read()
    return json.loads(data) if path.startswith("/stats") else None


def _urls(port: int, group: str, n: int) -> list[str]:
    """`n` target URLs of `group`, spread over the HOSTS addresses."""
    return [f"http://127.0.1.{1 + i % HOSTS}:{port}/{group}/{i}" for i in range(n)]


def drain(port: int, group: str, expected: int, timeout: float, tls: bool = False,
          in_flight: list[tuple[float, int]] | None = None) -> tuple[int, float]:
    """Waits for `expected` receipts of `group`: (count, receipts/s first to last). With
    `in_flight`, appends (seconds since the start, requests being answered) at each look."""
    import time

    start = time.monotonic()
    deadline = start + timeout
    last, changed = -1, time.monotonic()
    g: dict[str, float] = {}
    while time.monotonic() < deadline:
        if in_flight is not None:
            now = int(get_stats(port, "/stats/inflight", tls=tls)["now"])
            in_flight.append((time.monotonic() - start, now))
        g = get_stats(port, "/stats", tls=tls).get(group, {})
        count = int(g.get("count", 0))
        if count >= expected:
            break
        if count != last:
            last, changed = count, time.monotonic()
        elif time.monotonic() - changed > 15:
            break
        time.sleep(0.1)
    count = int(g.get("count", 0))
    if count < 2 or g["last"] <= g["first"]:
        raise RuntimeError(f"only {count} of {expected} deliveries arrived")
    return count, (count - 1) / (g["last"] - g["first"])


def scenario(ctx: Context) -> list[Result]:
    """Each case of CASES: the worker with defaults against the raw client."""
    receiver = ctx.procs.start("slow-receiver", [PYTHON, "-m", "bench.receiver", "--hosts",
                                                 str(HOSTS)], stdout_pipe=True)
    assert receiver.popen.stdout is not None
    port = read_port(receiver.popen.stdout)
    results: list[Result] = []
    try:
        # BENCH_SLOW_MS=1000 runs that case alone.
        only = os.environ.get("BENCH_SLOW_MS", "")
        for ms, in_flight, total, quick_total in CASES:
            if only and str(ms) not in only.split(","):
                continue
            results += _case(ctx, port, ms, in_flight, quick_total if ctx.quick else total)
    finally:
        ctx.procs.stop(receiver)
    return results


def _case(ctx: Context, port: int, ms: int, in_flight: int, total: int) -> list[Result]:
    group = f"slow{ms}"
    raw_group = f"slow{ms}-raw"
    raw = ctx.raw("rate", "--url", ",".join(_urls(port, raw_group, HOSTS)), "--lib", "aiohttp",
                  "--loop", "uvloop", "--concurrency", str(in_flight), "--duration",
                  "3" if ctx.quick else str(max(5, 5 * ms // 1000)),
                  "--body-bytes", str(BODY_BYTES), timeout=120)
    rows = max(1, total // SUBSCRIPTIONS)
    table = f"slow_rows_{ms}"
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, table, attach=table, pad=BODY_BYTES - 200)
        targets = _urls(port, group, SUBSCRIPTIONS)
        for o in range(OWNERS):
            subscribe(conn, table, targets[o::OWNERS], owner=f"owner{o}")
        get_stats(port, "/reset", method="POST")
        # BENCH_SLOW_DEBUG=1: the worker logs at DEBUG (its capacity's every change).
        debug = {"WEBHOOKS_LOG_LEVEL": "DEBUG"} if os.environ.get("BENCH_SLOW_DEBUG") else {}
        with ctx.worker(**debug) as worker:
            mark = ctx.cpu_mark(worker)
            insert_rows(conn, table, rows)
            series: list[tuple[float, int]] = []
            count, rate = drain(port, group, rows * SUBSCRIPTIONS, 300, in_flight=series)
            if debug:
                print("in flight:", " ".join(f"{t:.1f}s:{n}" for t, n in series[::5]),
                      file=sys.stderr)
            cpu = ctx.cpu_note(worker, mark, count)
            most = int(get_stats(port, "/stats/inflight")["most"])
            rss = ctx.rss_mb(worker)
    name = f"slow_targets: {ms} ms answers, deliveries/s"
    # How soon the worker's capacity (and the targets' windows) reached most of the peak.
    reached = next((t for t, n in series if n >= 0.9 * most), None)
    ramp = "" if reached is None else f" (90% of it {reached:.1f}s after the commit)"
    notes = (f"{count:,} deliveries of about {BODY_BYTES // 1024} KiB ({rows} rows x "
             f"{SUBSCRIPTIONS} subscriptions of {OWNERS} owners on {HOSTS} hosts), default "
             f"settings, first→last receipt; peak in flight {most:,}{ramp}; worker peak RSS "
             f"{rss or 0:.0f} MB; {cpu}; limit = raw aiohttp (uvloop) with {in_flight:,} "
             f"in flight over the same hosts ({raw['cpu_us']:.0f} us CPU/request)")
    return [
        ratio_result(name, rate, raw["rate"], "req/s", 0.6, notes),
        info_result(f"slow_targets: {ms} ms answers, peak in flight", most, in_flight,
                    "requests", "the most requests the receiver answered at once while the "
                    "worker drained; limit = the raw client's in flight"),
        ceiling_result(f"slow_targets: {ms} ms answers, worker peak RSS", rss, None, "MB",
                       300, "VmHWM of the worker after the drain"),
    ]
