"""The minimal receiver every delivery scenario posts to, run as its own process.

`python -m bench.receiver` binds 127.0.0.1 on a free port and prints it on the first
stdout line. Every request to /<group>/... answers 200 at once and is counted per group
(first and last receipt, wall clock); /hang/... never answers (the sender's timeout ends
it); /slow<ms>/... answers after <ms> milliseconds (a target across the internet);
/lat/... also records the receipt time of each event's resource_id. GET /stats and
/stats/times read the counters, GET /stats/inflight the requests being answered now and
at most since the last reset, POST /reset clears them, GET /static/<n> serves n bytes of
JSON (the plain-HTTP ceiling of the API scenario). `--hosts N` also binds 127.0.1.1 to
127.0.1.N on the same port (as many target hosts); `--cert` and `--key` serve TLS.
"""

from __future__ import annotations

import asyncio
import json
import select
import time
from dataclasses import dataclass, field
from typing import IO, Any

from aiohttp import web

from tests.support import receivers


@dataclass
class Group:
    """Receipts of one path group."""

    count: int = 0
    first: float = 0.0
    last: float = 0.0


@dataclass
class State:
    """Everything the receiver counts."""

    groups: dict[str, Group] = field(default_factory=dict)
    times: list[tuple[int, float]] = field(default_factory=list)
    static: dict[int, bytes] = field(default_factory=dict)
    inflight: int = 0  # requests being answered (/slow only)
    most: int = 0


def build_app(state: State) -> web.Application:
    """The receiver's aiohttp application over `state`."""

    async def hook(request: web.Request) -> web.StreamResponse:
        now = time.time()
        body = await request.read()
        name = request.match_info["group"]
        if name == "hang":
            await asyncio.sleep(3600)
        elif name.startswith("slow"):
            state.inflight += 1
            state.most = max(state.most, state.inflight)
            try:
                digits = name[4:].partition("-")[0]  # slow<ms>, slow<ms>-<anything>
                await asyncio.sleep(int(digits or 0) / 1000.0)
            finally:
                state.inflight -= 1
            now = time.time()
        group = state.groups.get(name)
        if group is None:
            group = state.groups[name] = Group(first=now)
        group.count += 1
        group.last = now
        if name == "lat" and body:
            # Only the latency scenario pays for parsing: it needs the row's id.
            try:
                event = json.loads(body)["event"]
                state.times.append((int(event["resource_id"]), now))
            except (ValueError, KeyError, TypeError):
                pass
        return web.Response(text="ok")

    async def stats(request: web.Request) -> web.StreamResponse:
        return web.json_response({k: {"count": g.count, "first": g.first, "last": g.last}
                                  for k, g in state.groups.items()})

    async def times(request: web.Request) -> web.StreamResponse:
        return web.json_response(state.times)

    async def inflight(request: web.Request) -> web.StreamResponse:
        return web.json_response({"now": state.inflight, "most": state.most})

    async def reset(request: web.Request) -> web.StreamResponse:
        state.groups.clear()
        state.times.clear()
        state.most = state.inflight
        return web.Response(text="ok")

    async def static(request: web.Request) -> web.StreamResponse:
        size = min(int(request.match_info["size"]), 1 << 22)
        body = state.static.get(size)
        if body is None:
            text = json.dumps({"pad": ""})
            body = state.static[size] = json.dumps(
                {"pad": "x" * max(0, size - len(text))}).encode()
        return web.Response(body=body, content_type="application/json")

    app = web.Application(client_max_size=1 << 22)
    app.router.add_get("/stats", stats)
    app.router.add_get("/stats/times", times)
    app.router.add_get("/stats/inflight", inflight)
    app.router.add_post("/reset", reset)
    app.router.add_get("/static/{size:\\d+}", static)
    app.router.add_route("*", "/{group}/{tail:.*}", hook)
    app.router.add_route("*", "/{group}", hook)
    return app


async def serve(port: int, hosts: int = 0, cert: str | None = None,
                key: str | None = None) -> None:
    """Serves until the process is terminated: on 127.0.0.1, and on 127.0.1.1 to
    127.0.1.`hosts` at the same port; over TLS with `cert` and `key`."""
    context = None
    if cert is not None:
        import ssl

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        runner = web.AppRunner(build_app(State()), access_log=None, handle_signals=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024, ssl_context=context)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    else:
        runner, bound = await receivers.serve(build_app(State()), port, backlog=1024,
                                              handle_signals=True)
    for n in range(1, hosts + 1):
        await web.TCPSite(runner, f"127.0.1.{n}", bound, backlog=1024,
                          ssl_context=context).start()
    print(bound, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def read_port(stream: IO[bytes], timeout: float = 15.0) -> int:
    """The port a receiver printed on its first stdout line (waits at most `timeout`)."""
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        raise TimeoutError("the receiver did not report its port")
    line = stream.readline().decode().strip()
    if not line.isdigit():
        raise RuntimeError(f"the receiver printed {line!r} instead of its port")
    return int(line)


def run_loop(main: Any) -> None:
    """Runs the coroutine on uvloop when installed (as fast a receiver as we can have)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.receiver")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--hosts", type=int, default=0)
    parser.add_argument("--cert", default=None)
    parser.add_argument("--key", default=None)
    args = parser.parse_args()
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # thousands of connections at once (slow targets)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    run_loop(serve(args.port, args.hosts, args.cert, args.key))
