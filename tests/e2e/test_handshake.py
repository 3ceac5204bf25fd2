"""The verification handshake against real receivers on 127.0.0.1 (the secret's form, and
the guard's refusal before any connection: tests/unit/test_handshake.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from service.api.handshake import BODY_LIMIT, HandshakeFailed, new_secret, verify
from service.http import make_client
from tests.support.clients import ANSWERED
from tests.support.clients import handshake_failure as failure
from tests.support.net import free_port
from tests.support.receivers import Received, Receiver, echo_secret, status


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    http = make_client(allow_private=True, timeout=ANSWERED)
    yield http
    await http.aclose()


def closed_port() -> int:
    return free_port()  # nothing listens there, and the kernel hands it to no socket




async def test_echo_passes(receiver: Receiver, client: httpx.AsyncClient) -> None:
    secret = new_secret()
    await verify(client, receiver.url, secret, ANSWERED)
    request = receiver.received[-1]
    assert request.method == "POST" and request.path == "/hook"
    assert request.headers["x-hook-secret"] == secret
    assert request.body in (b"", b"{}")


async def test_missing_header(receiver: Receiver, client: httpx.AsyncClient) -> None:
    async def silent(req: Received) -> web.StreamResponse:
        return web.Response(status=200, text="ok")

    receiver.behaviour = silent
    assert "did not echo the X-Hook-Secret" in await failure(client, receiver.url)


async def test_different_header(receiver: Receiver, client: httpx.AsyncClient) -> None:
    receiver.behaviour = status(200, {"X-Hook-Secret": "whsec_something-else"})
    message = await failure(client, receiver.url)
    assert "differs" in message and "something-else" not in message


async def test_status_other_than_200(receiver: Receiver, client: httpx.AsyncClient) -> None:
    for code in (500, 201, 204, 404):
        receiver.behaviour = status(code)
        assert f"HTTP {code}" in await failure(client, receiver.url)


async def test_redirect_is_not_followed(receiver: Receiver, client: httpx.AsyncClient) -> None:
    async with Receiver() as other:
        receiver.behaviour = status(302, {"Location": other.url})
        message = await failure(client, receiver.url)
        assert "redirect (302 to http://127.0.0.1" in message and "not followed" in message
        assert other.received == []


async def test_timeout(receiver: Receiver, client: httpx.AsyncClient) -> None:
    release = asyncio.Event()

    async def hang(req: Received) -> web.StreamResponse:
        await asyncio.wait_for(release.wait(), 10)
        return await echo_secret(req)

    receiver.behaviour = hang
    started = time.monotonic()
    try:
        message = await failure(client, receiver.url, timeout=0.3)
    finally:
        release.set()
    assert "did not answer" in message and "0.3 seconds" in message
    assert time.monotonic() - started < 3


async def test_slow_body_is_bounded_by_the_timeout(client: httpx.AsyncClient) -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"X-Hook-Secret": request.headers["x-hook-secret"]})
        await response.prepare(request)
        for _ in range(100):
            await response.write(b"x")
            await asyncio.sleep(0.1)
        return response

    app = web.Application()
    app.router.add_post("/", trickle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        started = time.monotonic()
        # 200 with the header: the trickling body is not read past BODY_LIMIT or the timeout.
        try:
            await verify(client, f"http://127.0.0.1:{port}/", new_secret(), 0.5)
        except HandshakeFailed as exc:
            assert "did not answer" in str(exc)
        assert time.monotonic() - started < 3
    finally:
        await runner.cleanup()


async def test_large_body_is_not_read_whole(receiver: Receiver,
                                            client: httpx.AsyncClient) -> None:
    receiver.behaviour = status(200, body="y" * (BODY_LIMIT * 100))
    await verify(client, receiver.url, new_secret(), ANSWERED)


async def test_closed_port(client: httpx.AsyncClient) -> None:
    message = await failure(client, f"http://127.0.0.1:{closed_port()}/hook")
    assert "could not reach the target" in message and "refused" in message


async def test_no_cookie_is_kept_between_handshakes(receiver: Receiver,
                                                    client: httpx.AsyncClient) -> None:
    async def set_cookie(req: Received) -> web.StreamResponse:
        response = await echo_secret(req)
        response.headers.add("Set-Cookie", "session=owner-a; Path=/")
        response.headers.add("Set-Cookie", "tracking=1; Domain=127.0.0.1; Path=/; Max-Age=3600")
        return response

    receiver.behaviour = set_cookie
    await verify(client, receiver.url, new_secret(), ANSWERED)
    # Another owner's handshake, to the same target, through the same client.
    await verify(client, receiver.url.replace("/hook", "/other"), new_secret(), ANSWERED)
    await verify(client, receiver.url, new_secret(), ANSWERED)
    assert len(receiver.received) == 3
    for request in receiver.received:
        assert "cookie" not in {k.lower() for k in request.headers}, request.headers
    assert not client.cookies


async def test_handshake_asks_for_no_compression(receiver: Receiver,
                                                 client: httpx.AsyncClient) -> None:
    await verify(client, receiver.url, new_secret(), ANSWERED)
    headers = {k.lower(): v for k, v in receiver.received[-1].headers.items()}
    assert headers.get("accept-encoding") == "identity"
