"""The worker's HTTP client (service/curl/) against real servers on 127.0.0.1: what it
never does (follow redirects, use a proxy, keep cookies, connect where the guard says no,
trust a certificate no CA signed, read more than its limits) and that it stays usable
after a cancelled or failed POST (a name that does not resolve:
tests/unit/test_curl_client.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from service.curl import AttemptError, CurlClient
from service.curl.transfer import MAX_HEADER_BYTES
from service.ssrf import TargetRejected
from tests.support.clients import curl_client as client
from tests.support.receivers import Received, Receiver, status

JSON = ["Content-Type: application/json"]




def port_of(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


async def post(curl: CurlClient, url: str, timeout: float = 5.0
               ) -> tuple[int, str | None, bytes]:
    host = url.split("/")[2].rsplit(":", 1)[0]
    return await curl.post(url, host, port_of(url), b'{"a": 1}', JSON, timeout)


@pytest.fixture
def listening_socket() -> Iterator[socket.socket]:
    """A TCP socket on 127.0.0.1 that accepts nothing: a proxy that must never be used."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def connections(sock: socket.socket) -> int:
    """How many connections wait on `sock`."""
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


# Linux watches libcurl's sockets through the client's own epoll object; other systems
# through the loop's add_reader and add_writer. Both are run here.
WATCHERS = pytest.mark.parametrize("epoll", [True, False], ids=["epoll", "loop"])


@WATCHERS
async def test_posts_and_reuses_its_connection(epoll: bool) -> None:
    peers: set[tuple[str, int]] = set()

    async def answer(req: Received) -> web.StreamResponse:
        assert req.request is not None and req.request.transport is not None
        peers.add(req.request.transport.get_extra_info("peername"))
        return web.Response(status=201, text="ok")

    async with Receiver(behaviour=answer) as receiver, client(watch_with_epoll=epoll) as curl:
        for _ in range(5):
            assert await post(curl, receiver.url) == (201, None, b"ok")
        assert len(peers) == 1  # one keep-alive connection for all five
        # Many at once, on at most 8 connections: each socket is watched while its
        # answer is due and forgotten when its connection goes back to the pool.
        answers = await asyncio.gather(*(post(curl, receiver.url) for _ in range(40)))
        assert answers == [(201, None, b"ok")] * 40
        assert len(receiver.received) == 45
        assert 1 < len(peers) <= 8
        assert receiver.received[0].body == b'{"a": 1}'
        assert receiver.received[0].headers["Content-Type"] == "application/json"
        assert receiver.received[0].headers["Accept-Encoding"] == "identity"
        assert "Expect" not in receiver.received[0].headers


@contextlib.contextmanager
def threaded_receiver(arrived: list[float]) -> Iterator[str]:
    """A keep-alive HTTP/1.1 target served by a thread of its own, off the event loop,
    noting when each request has arrived whole; yields its URL."""

    class Answer(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            arrived.append(time.monotonic())
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@WATCHERS
async def test_a_lone_post_is_on_its_way_before_the_loop_turns(epoll: bool) -> None:
    """The client's only transfer is started inside post(): on a kept-alive connection its
    request reaches the target even while the loop is held up right after (a burst's
    transfers are started together at the loop's next turn)."""
    arrived: list[float] = []
    with threaded_receiver(arrived) as url:
        async with client(watch_with_epoll=epoll) as curl:
            first = await post(curl, url)  # the connection, kept alive
            task = asyncio.create_task(post(curl, url))
            await asyncio.sleep(0)  # the task runs up to its first wait
            deadline = time.monotonic() + 5.0
            while len(arrived) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # the loop is held: nothing it schedules runs meanwhile
            sent_while_held = len(arrived) == 2
            second = await task
    assert first == second == (200, None, b"ok")
    assert sent_while_held, "the request waited for the loop's next turn"


async def test_never_follows_a_redirect() -> None:
    async with Receiver() as elsewhere, \
            Receiver(behaviour=status(307, {"Location": elsewhere.url})) as target, \
            client() as curl:
        code, _, _ = await post(curl, target.url)
        assert code == 307
        assert len(target.received) == 1 and elsewhere.received == []


async def test_never_uses_a_proxy_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, listening_socket: socket.socket) -> None:
    proxy = f"http://127.0.0.1:{listening_socket.getsockname()[1]}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                 "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    async with Receiver() as receiver, client() as curl:
        assert (await post(curl, receiver.url))[0] == 200
    assert len(receiver.received) == 1
    assert connections(listening_socket) == 0


async def test_keeps_no_cookie() -> None:
    async with Receiver(behaviour=status(200, {"Set-Cookie": "session=abc; Path=/"})
                        ) as receiver, client() as curl:
        await post(curl, receiver.url)
        await post(curl, receiver.url)
    assert all("Cookie" not in r.headers for r in receiver.received)


async def test_the_guard_checks_every_socket_before_it_connects() -> None:
    # IP literals are checked before the client (delivery.target_url); the client checks
    # again, at connect time, whatever address it is about to reach.
    async with Receiver() as receiver, client(allow_private=False) as curl:
        with pytest.raises(TargetRejected, match="loopback"):
            await post(curl, receiver.url)
        with pytest.raises(TargetRejected, match="loopback"):
            await post(curl, f"http://localhost:{port_of(receiver.url)}/hook")
    assert receiver.received == []


async def test_reads_at_most_its_limits() -> None:
    async def big(req: Received) -> web.StreamResponse:
        return web.Response(status=500, body=b"x" * 1_000_000,
                            headers={"Retry-After": "7"})

    async def wide(req: Received) -> web.StreamResponse:
        return web.Response(status=500, headers={
            f"X-Junk-{n}": "a" * 1000 for n in range(MAX_HEADER_BYTES // 1000 + 2)})

    async def endless(req: Received) -> web.StreamResponse:
        assert req.request is not None
        response = web.StreamResponse(status=500)
        await response.prepare(req.request)
        until = time.monotonic() + 10.0  # past the POST's timeout below
        with contextlib.suppress(ConnectionError):
            while time.monotonic() < until:
                await response.write(b"y" * 65536)
        return response

    async with Receiver(behaviour=big) as large, Receiver(behaviour=wide) as many, \
            Receiver(behaviour=endless) as stream, client() as curl:
        code, retry_after, body = await post(curl, large.url)
        assert (code, retry_after, body) == (500, "7", b"x" * 1024)
        # The body is not read past the limit: a body that never ends is no timeout.
        assert await post(curl, stream.url, timeout=5.0) == (500, None, b"y" * 1024)
        with pytest.raises(AttemptError, match="headers exceed"):
            await post(curl, many.url)
        # Still usable after both.
        assert (await post(curl, large.url))[0] == 500


@WATCHERS
async def test_a_timeout_a_refusal_and_a_cancellation_leave_it_usable(epoll: bool) -> None:
    release = asyncio.Event()

    async def hang(req: Received) -> web.StreamResponse:
        await release.wait()
        return web.Response(status=200)

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{closed.getsockname()[1]}/"
    async with (Receiver(behaviour=hang) as hanging, Receiver() as healthy,
                client(watch_with_epoll=epoll) as curl):
        try:
            with pytest.raises(TimeoutError):
                await post(curl, hanging.url, timeout=0.3)
            with pytest.raises(AttemptError, match="cannot connect"):
                await post(curl, refused)
            task = asyncio.create_task(post(curl, hanging.url))
            await hanging.wait_for(lambda r: len(r.received) == 2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await post(curl, healthy.url))[0] == 200
        finally:
            release.set()  # the hanging handlers end before their server stops


def self_signed(directory: Path) -> ssl.SSLContext:
    """A server TLS context with a certificate for 127.0.0.1 that no CA signed."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


async def test_verifies_the_target_certificate(tmp_path: Path) -> None:
    received: list[bytes] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=self_signed(tmp_path))
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        async with client() as curl:
            with pytest.raises(AttemptError,
                               match=r"TLS with 127\.0\.0\.1:\d+ failed: .*certificate"):
                await curl.post(f"https://127.0.0.1:{port}/hook", "127.0.0.1", port, b"{}",
                                JSON, 5.0)
        assert received == []
    finally:
        await runner.cleanup()
