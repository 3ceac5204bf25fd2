"""The API process freezes the heap it starts with: a full garbage collection then walks
only what requests made since, not every module, route and schema (a 40-50 ms pause that
every request in flight waited out, the GET's p99 in `make bench`)."""

from __future__ import annotations

import asyncio
import gc
import time

import httpx

from service.commands.runner import api_socket, serve_api
from tests.support.net import free_port
from tests.support.worker import make_settings


async def test_the_api_freezes_its_startup_heap(db_url: str) -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    port, stop = free_port(), asyncio.Event()
    server = asyncio.create_task(serve_api(make_settings(db_url), api_socket("127.0.0.1", port),
                                           stop))
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            while True:
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and not server.done()
                await asyncio.sleep(0.05)
        # Litestar's app, its routes and the pool are among the frozen objects.
        assert gc.get_freeze_count() > 10_000
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)
        gc.unfreeze()
