"""The physical limits of HTTP delivery: raw POSTs of a 600-byte JSON body, no database.

Run as its own process (`python -m bench.rawclient MODE ...`, one JSON object on the last
stdout line) so each measurement gets a clean interpreter, like the worker it is compared
with. Modes: `rate` (requests/s for a fixed time at a concurrency), `burst` (seconds to
post N requests), `latency` (round-trip percentiles when paced at R requests/s), `quiet`
(one POST after each of several quiet gaps, on an open connection: the round trip of an
idle machine), `get` (the API scenario's load generator when wrk is not installed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

# About the size of a delivery of the bench tables (event envelope plus a padded row).
BODY = json.dumps({"event": {"id": 1, "name": "row.create", "resource": "rows",
                             "resource_id": 1, "user_id": "postgres",
                             "occurred_at": "2024-01-01T00:00:00.000000Z"},
                   "resource": {"id": 1, "a": 1, "b": "x", "pad": "x" * 400}}).encode()
HEADERS = {"Content-Type": "application/json"}

Post = Callable[[], Awaitable[None]]


# The body of every request (--body-bytes makes a larger one) and the CA file trusted for
# https URLs (--ca).
OPTIONS: dict[str, Any] = {"body": BODY, "ca": None}


def padded_body(size: int) -> bytes:
    """A delivery-shaped JSON body of about `size` bytes."""
    event = json.loads(BODY)
    event["resource"]["pad"] = "x" * max(0, size - len(BODY) + 400)
    return json.dumps(event).encode()


async def _aiohttp_client(url: str, concurrency: int) -> tuple[Post, Callable[[], Awaitable[Any]]]:
    """aiohttp posting to `url`, or in turn to each of several comma-separated URLs (as
    many target hosts), at most `concurrency` connections in all."""
    import itertools
    import ssl

    import aiohttp

    context = (ssl.create_default_context(cafile=OPTIONS["ca"]) if OPTIONS["ca"] else None)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
        limit=concurrency, ssl=context if context is not None else True))
    urls = itertools.cycle(url.split(","))
    body = OPTIONS["body"]

    async def post() -> None:
        async with session.post(next(urls), data=body, headers=HEADERS) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"receiver answered {resp.status}")

    return post, session.close


async def _httpx_client(url: str, concurrency: int) -> tuple[Post, Callable[[], Awaitable[Any]]]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = httpx.AsyncClient(limits=limits, timeout=30.0)

    async def post() -> None:
        resp = await client.post(url, content=BODY, headers=HEADERS)
        if resp.status_code != 200:
            raise RuntimeError(f"receiver answered {resp.status_code}")

    return post, client.aclose


async def _curl_client(url: str, concurrency: int) -> tuple[Post, Callable[[], Awaitable[Any]]]:
    """The worker's own HTTP client (service.curl: libcurl's multi interface), with its
    guarantees on (limits on the answer, no decompression, the address guard at connect),
    and the headers a delivery carries besides its signature."""
    from urllib.parse import urlsplit

    from service.curl import CurlClient

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    client = CurlClient(allow_private=True, max_connections=concurrency)
    headers = [f"{k}: {v}" for k, v in HEADERS.items()]

    async def post() -> None:
        status, _, _ = await client.post(url, host, port, BODY, headers, 30.0)
        if status != 200:
            raise RuntimeError(f"receiver answered {status}")

    return post, client.close


CLIENTS = {"aiohttp": _aiohttp_client, "httpx": _httpx_client, "curl": _curl_client}


async def rate(url: str, lib: str, concurrency: int, duration: float) -> dict[str, Any]:
    """Requests/s of `concurrency` loops posting back to back for `duration` seconds."""
    post, close = await CLIENTS[lib](url, concurrency)
    try:
        # Warm-up: open the connections before the clock starts.
        await asyncio.gather(*(post() for _ in range(concurrency)))
        done = 0
        stop_at = time.perf_counter() + duration

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                await post()
                done += 1

        start, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    finally:
        await close()
    return {"rate": done / elapsed, "requests": done, "seconds": elapsed,
            "cpu_us": 1e6 * cpu / max(done, 1)}


async def burst(url: str, lib: str, concurrency: int, count: int) -> dict[str, Any]:
    """Seconds to post `count` requests with at most `concurrency` in flight (cold start)."""
    post, close = await CLIENTS[lib](url, concurrency)
    try:
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                await post()

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(count)))
        elapsed = time.perf_counter() - start
    finally:
        await close()
    return {"seconds": elapsed, "requests": count}


async def latency(url: str, lib: str, per_second: float, duration: float) -> dict[str, Any]:
    """Round-trip milliseconds of requests started every 1/per_second s for `duration` s."""
    post, close = await CLIENTS[lib](url, 8)
    samples: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def timed() -> None:
        t0 = time.perf_counter()
        await post()
        samples.append((time.perf_counter() - t0) * 1000.0)

    try:
        await post()  # an open connection, as a running worker has
        start = time.perf_counter()
        count = int(per_second * duration)
        for i in range(count):
            # Paced on an absolute schedule, so a slow request does not delay the next.
            delay = start + i / per_second - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(timed())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        await close()
    samples.sort()

    def pct(q: float) -> float:
        return samples[min(len(samples) - 1, max(0, round(q / 100 * len(samples)) - 1))]

    return {"p50": pct(50), "p95": pct(95), "p99": pct(99), "requests": len(samples)}


async def quiet(url: str, lib: str, gaps: list[float]) -> dict[str, Any]:
    """Round-trip milliseconds of one POST after each quiet gap (each gap twice), on a
    connection opened before: what an idle machine's first request costs (its processes
    and caches woken), the limit of a lone event after the same quiet."""
    post, close = await CLIENTS[lib](url, 1)
    samples: list[tuple[float, float]] = []
    try:
        await post()
        for gap in (g for g in gaps for _ in range(2)):
            await asyncio.sleep(gap)  # the quiet being measured
            t0 = time.perf_counter()
            await post()
            samples.append((gap, (time.perf_counter() - t0) * 1000.0))
    finally:
        await close()
    return {"samples": samples}


async def get(url: str, concurrency: int, duration: float, header: str | None
              ) -> dict[str, Any]:
    """Requests/s and latency percentiles of GETs back to back (the fallback when wrk is
    missing: slower than wrk, so it understates the server)."""
    import aiohttp

    headers = dict([header.split(": ", 1)]) if header else {}
    samples: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                     headers=headers) as session:
        stop_at = time.perf_counter() + duration

        async def loop() -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                async with session.get(url) as resp:
                    await resp.read()
                    errors += resp.status != 200
                samples.append((time.perf_counter() - t0) * 1000.0)

        start = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    samples.sort()
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] if samples else 0.0
    return {"rate": len(samples) / elapsed, "p99": p99, "errors": errors}


def main() -> None:
    """Parses the command line, runs one measurement, prints its JSON result."""
    parser = argparse.ArgumentParser(prog="python -m bench.rawclient")
    parser.add_argument("mode", choices=["rate", "burst", "latency", "quiet", "get"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--lib", choices=sorted(CLIENTS), default="aiohttp")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--per-second", type=float, default=200.0)
    parser.add_argument("--header", default=None, help="`Name: value`, for get")
    parser.add_argument("--gaps", default="0.05,0.5,2", help="seconds of quiet, for quiet")
    parser.add_argument("--body-bytes", type=int, default=0, help="a body of about N bytes")
    parser.add_argument("--ca", default=None, help="CA file trusted for https (aiohttp)")
    args = parser.parse_args()
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # thousands of connections at once
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.body_bytes:
        OPTIONS["body"] = padded_body(args.body_bytes)
    OPTIONS["ca"] = args.ca
    if args.mode == "rate":
        coro = rate(args.url, args.lib, args.concurrency, args.duration)
    elif args.mode == "burst":
        coro = burst(args.url, args.lib, args.concurrency, args.count)
    elif args.mode == "latency":
        coro = latency(args.url, args.lib, args.per_second, args.duration)
    elif args.mode == "quiet":
        coro = quiet(args.url, args.lib, [float(g) for g in args.gaps.split(",")])
    else:
        coro = get(args.url, args.concurrency, args.duration, args.header)
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(coro)
    else:
        result = asyncio.run(coro)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
