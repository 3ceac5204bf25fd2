"""Scenario 7, the REST API: requests/s and p99 of GET /api/v1/webhooks/:id/ and of the list
(an owner with 1,000 subscriptions), against one `webhooks api` process, with wrk.

The limit is the same load on the receiver (aiohttp on uvloop, one process) serving a
static JSON body of the same size: what one Python HTTP process does here with no work.
Without wrk the aiohttp load generator of bench.rawclient stands in (and says so).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import urllib.request
from dataclasses import dataclass

from bench.common import (
    PYTHON,
    Result,
    ceiling_result,
    connect,
    create_table,
    floor_result,
    info_result,
    reset_service_state,
    subscribe,
    wait_until,
)
from bench.context import Context

SUBSCRIPTIONS = 1000
_RPS = re.compile(r"^Requests/sec:\s*([0-9.]+)", re.MULTILINE)
_P99 = re.compile(r"^\s*99(?:\.0+)?%\s+([0-9.]+)(us|ms|s|m)\b", re.MULTILINE)
_NON2XX = re.compile(r"Non-2xx or 3xx responses:\s*(\d+)")
_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


@dataclass(frozen=True)
class Load:
    """What one load run measured."""

    rps: float
    p99_ms: float
    tool: str


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load(ctx: Context, url: str, seconds: int, token: str | None = None) -> Load:
    """GET `url` with 32 connections for `seconds` (wrk -t2 -c32, else the Python fallback)."""
    header = f"Authorization: Bearer {token}" if token else None
    if shutil.which("wrk"):
        argv = ["wrk", "-t2", "-c32", f"-d{seconds}s", "--latency", "--timeout", "5s"]
        if header:
            argv += ["-H", header]
        out = subprocess.run([*argv, url], capture_output=True, text=True,
                             timeout=seconds + 30, start_new_session=True)
        rps, p99 = _RPS.search(out.stdout), _P99.search(out.stdout)
        if out.returncode != 0 or not rps or not p99:
            raise RuntimeError(f"wrk failed: {(out.stderr or out.stdout).strip()[-200:]}")
        bad = _NON2XX.search(out.stdout)
        if bad and int(bad.group(1)):
            raise RuntimeError(f"{bad.group(1)} responses to {url} were not 2xx")
        return Load(float(rps.group(1)), float(p99.group(1)) * _UNIT_MS[p99.group(2)], "wrk")
    args = ["--url", url, "--concurrency", "32", "--duration", str(seconds)]
    result = ctx.raw("get", *args, *(["--header", header] if header else []),
                     timeout=seconds + 30)
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} responses to {url} were not 200")
    return Load(result["rate"], result["p99"], "python fallback (wrk not installed)")


def _size(url: str, token: str) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {url} answered {resp.status}")
        return len(resp.read())


def _token(ctx: Context) -> str:
    out = subprocess.run([PYTHON, "-m", "service", "token", "create", "--owner", "bench"],
                         capture_output=True, text=True, timeout=30,
                         env=_env(ctx), start_new_session=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"webhooks token create failed: {out.stderr.strip()[-200:]}")
    return lines[-1].strip()


def _env(ctx: Context) -> dict[str, str]:
    import os

    return {**os.environ, "DATABASE_URL": ctx.url}


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def scenario(ctx: Context) -> list[Result]:
    """GET by id and the list: req/s (≥ 1,500) and p99 (≤ 25 ms), with the static limit."""
    seconds = 2 if ctx.quick else 10
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        create_table(conn, "api_rows", attach="api_rows")
        ids = subscribe(conn, "api_rows", [ctx.target("api", i) for i in range(SUBSCRIPTIONS)])
    token = _token(ctx)
    port = free_port()
    base = f"http://127.0.0.1:{port}/api/v1/webhooks/"
    cases = [("GET /webhooks/:id/", f"{base}{ids[len(ids) // 2]}/"),
             ("GET /webhooks/ (page of 100)", base)]
    if not ctx.quick:
        cases.append(("GET /webhooks/?limit=1000", f"{base}?limit=1000"))
    results: list[Result] = []
    # BENCH_API_PROCESSES=N measures `webhooks api --processes N` (its CPU figures are
    # then the parent's alone, which does no serving).
    processes = os.environ.get("BENCH_API_PROCESSES", "1")
    with ctx.procs.running_proc("api", [PYTHON, "-m", "service", "api", "--host",
                                        "127.0.0.1", "--port", str(port),
                                        "--processes", processes],
                                # The per-token rate limit (100/s by default) would measure
                                # itself: the bench measures the API's capacity.
                                env={"DATABASE_URL": ctx.url, "WEBHOOKS_RATE_LIMIT": "0"},
                                profile=ctx.profile_path("api")) as api:
        if not wait_until(lambda: not api.alive() or _healthy(port), 30) or not api.alive():
            raise RuntimeError(f"the API did not start: {api.tail()}")
        for i, (label, url) in enumerate(cases):
            size = _size(url, token)
            if i == 0:
                load(ctx, url, 1, token)  # warm-up: pools, caches, connections
            mark = ctx.cpu_mark(api)
            got = load(ctx, url, seconds, token)
            cpu = ctx.cpu_note(api, mark, int(got.rps * seconds))
            static = load(ctx, f"http://127.0.0.1:{ctx.port}/static/{size}",
                          max(2, seconds // 2))
            notes = (f"{got.tool} -t2 -c32 {seconds}s, {size:,}-byte body, "
                     "WEBHOOKS_RATE_LIMIT=0; limit = the same "
                     f"load on a static {size:,}-byte JSON from the aiohttp receiver "
                     f"({static.rps:,.0f} req/s, p99 {static.p99_ms:.1f} ms); {cpu}")
            if i < 2:
                results += [
                    floor_result(f"api: {label} req/s", got.rps, static.rps, "req/s", 1500,
                                 notes),
                    ceiling_result(f"api: {label} p99", got.p99_ms, static.p99_ms, "ms", 25),
                ]
            else:
                results.append(info_result(f"api: {label} req/s", got.rps, static.rps,
                                           "req/s", notes + f"; p99 {got.p99_ms:.1f} ms"))
    return results
