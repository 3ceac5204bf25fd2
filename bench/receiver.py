"""The minimal receiver every delivery scenario posts to, run as its own process.

`python -m bench.receiver` binds 127.0.0.1 on a free port and prints it on the first
stdout line. Every request to /<group>/... answers 200 at once and is counted per group
(first and last receipt, wall clock); /hang/... never answers (the sender's timeout ends
it); /lat/... also records the receipt time of each event's resource_id. GET /stats and
/stats/times read the counters, POST /reset clears them, GET /static/<n> serves n bytes of
JSON (the plain-HTTP ceiling of the API scenario).
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


def build_app(state: State) -> web.Application:
    """The receiver's aiohttp application over `state`."""

    async def hook(request: web.Request) -> web.StreamResponse:
        now = time.time()
        body = await request.read()
        name = request.match_info["group"]
        if name == "hang":
            await asyncio.sleep(3600)
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

    async def reset(request: web.Request) -> web.StreamResponse:
        state.groups.clear()
        state.times.clear()
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
    app.router.add_post("/reset", reset)
    app.router.add_get("/static/{size:\\d+}", static)
    app.router.add_route("*", "/{group}/{tail:.*}", hook)
    app.router.add_route("*", "/{group}", hook)
    return app


async def serve(port: int) -> None:
    """Serves until the process is terminated."""
    runner, bound = await receivers.serve(build_app(State()), port, backlog=1024,
                                          handle_signals=True)
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
    run_loop(serve(parser.parse_args().port))
