"""https targets through the worker's HTTP client (service/curl/): certificates verified
against the system's CAs plus WEBHOOKS_CA_BUNDLE's, connections kept open and reused per
host, and a new connection to a host resuming the TLS session of an earlier one (the
WEBHOOKS_CA_BUNDLE setting's own checks: tests/unit/test_config.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from service.curl import AttemptError, CurlClient
from service.http import make_client
from tests.support.tls import TlsFiles, make_tls


@asynccontextmanager
async def tls_server(files: TlsFiles, delay: float = 0.0
                     ) -> AsyncIterator[tuple[str, list[tuple[int, bool]]]]:
    """An https server on 127.0.0.1: its URL and, per request, (client port, whether its
    connection resumed a TLS session)."""
    seen: list[tuple[int, bool]] = []

    async def hook(request: web.Request) -> web.StreamResponse:
        await request.read()
        transport = request.transport
        assert transport is not None
        ssl_object = transport.get_extra_info("ssl_object")
        seen.append((transport.get_extra_info("peername")[1], bool(ssl_object.session_reused)))
        await asyncio.sleep(delay)
        if request.headers.get("X-Verify-Challenge"):
            return web.Response(headers={"X-Verify-Challenge":
                                         request.headers["X-Verify-Challenge"]})
        return web.Response(text="ok")

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    context.num_tickets = 4  # TLS 1.3 tickets are used once each: enough for the test
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"https://127.0.0.1:{port}/hook", seen
    finally:
        await runner.cleanup()


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return make_tls(tmp_path)


async def post(curl: CurlClient, url: str) -> int:
    port = int(url.split(":")[2].split("/")[0])
    status, _, _ = await curl.post(url, "127.0.0.1", port, b"{}",
                                   ["Content-Type: application/json"], 5.0)
    return status


async def test_a_private_ca_is_trusted_only_when_given(tls: TlsFiles) -> None:
    async with tls_server(tls) as (url, seen):
        plain = CurlClient(allow_private=True)
        try:
            with pytest.raises(AttemptError, match=r"TLS with 127\.0\.0\.1"):
                await post(plain, url)
        finally:
            await plain.close()
        trusting = CurlClient(allow_private=True, ca_bundle=str(tls.ca))
        try:
            assert await post(trusting, url) == 200
        finally:
            await trusting.close()
    assert len(seen) == 1


async def test_connections_are_reused_and_new_ones_resume_the_tls_session(
        tls: TlsFiles) -> None:
    async with tls_server(tls, delay=0.05) as (url, seen):
        curl = CurlClient(allow_private=True, ca_bundle=str(tls.ca), max_connections=16)
        try:
            for _ in range(10):  # one after another: one connection, kept open
                assert await post(curl, url) == 200
            assert len({port for port, _ in seen}) == 1 and not seen[0][1]
            # Three at once: two more connections, each resuming a session of the first
            # (libcurl keeps two TLS 1.3 tickets per host, each used once).
            assert await asyncio.gather(*(post(curl, url) for _ in range(3))) == [200] * 3
        finally:
            await curl.close()
    later = seen[10:]
    new = {port: reused for port, reused in later if port != seen[0][0]}
    assert len(new) == 2 and all(new.values()), seen


async def test_the_handshake_client_trusts_the_same_bundle(tls: TlsFiles) -> None:
    async with tls_server(tls) as (url, _):
        for bundle, ok in ((None, False), (str(tls.ca), True)):
            client = make_client(allow_private=True, timeout=5.0, ca_bundle=bundle)
            try:
                if ok:
                    assert (await client.post(url, content=b"{}")).status_code == 200
                else:
                    with pytest.raises(Exception, match="certificate"):
                        await client.post(url, content=b"{}")
            finally:
                await client.aclose()
