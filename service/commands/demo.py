"""`webhooks demo`: the whole flow in one command.

A receiver on 127.0.0.1 answers the handshake and verifies signatures with the
`standardwebhooks` package; the demo subscribes it through the REST API, inserts an invoice
and a payment with `psql` (not through the API) and prints each delivery. When no API
answers at --api, it runs one (and a worker) in this process for the duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import msgspec
from aiohttp import web

from service.config import Settings
from service.logs import printable, printable_json


def _verify(secret: str, body: bytes, headers: dict[str, str]) -> tuple[bool, bool]:
    """Whether the Standard Webhooks signature and the X-Hook-Signature verify."""
    from standardwebhooks import Webhook

    try:
        Webhook(secret).verify(body, headers)
        standard = True
    except Exception:
        standard = False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    legacy = hmac.compare_digest(expected, headers.get("x-hook-signature", ""))
    return standard, legacy


class DemoReceiver:
    """Answers the handshake, keeps the secret it was given, and records deliveries."""

    def __init__(self) -> None:
        self.secret = ""
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        self.arrived = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if "X-Hook-Secret" in request.headers:
            self.secret = request.headers["X-Hook-Secret"]
            return web.Response(headers={"X-Hook-Secret": self.secret})
        self.deliveries.append(({k.lower(): v for k, v in request.headers.items()}, body))
        self.arrived.set()
        return web.Response(text="ok")


def _psql(url: str, sql: str) -> str:
    psql = shutil.which("psql")
    if psql is None:
        raise SystemExit("webhooks demo: psql is not installed (it writes the demo rows)")
    out = subprocess.run([psql, url, "-v", "ON_ERROR_STOP=1", "-qAtc", sql],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"webhooks demo: psql failed: {out.stderr.strip()}")
    return out.stdout.strip()


async def _api_up(api: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as client:
            return (await client.get(f"{api}/healthz")).status_code == 200
    except httpx.HTTPError:
        return False


async def _ensure_api(settings: Settings, api: str, token: str | None, token_file: str,
                      stop: asyncio.Event) -> tuple[str, asyncio.Task[None] | None]:
    """The token to use, and the API and worker this demo started (None when one answered)."""
    from service.commands.dev import prepare
    from service.commands.runner import api_socket, run_all

    own_service: asyncio.Task[None] | None = None
    if not await _api_up(api):
        parts = urlsplit(api)
        print(f"no API at {api}: starting one, with a worker, for this demo")
        settings = Settings(**{**settings.__dict__, "allow_private_targets": True})
        sock = api_socket(parts.hostname or "127.0.0.1", parts.port or 8000)
        token = token or prepare(settings, Path(token_file))
        own_service = asyncio.create_task(run_all(
            settings, sock, concurrency=settings.concurrency, stop=stop))
        deadline = time.monotonic() + 30
        while not await _api_up(api):
            if time.monotonic() > deadline or own_service.done():
                raise SystemExit("webhooks demo: the API did not come up")
            await asyncio.sleep(0.1)
    if token is None:
        path = Path(token_file)
        if not path.exists():
            raise SystemExit("webhooks demo: no token; pass --token or run `make run` first")
        token = path.read_text().strip()
    return token, own_service


async def _start_receiver(receiver: DemoReceiver) -> tuple[web.AppRunner, str]:
    """Serves `receiver` on a free port of 127.0.0.1; the runner and the target URL."""
    app = web.Application()
    app.router.add_post("/webhooks", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/webhooks"


async def _subscribe_and_write(api: str, token: str, target: str, database_url: str,
                               receiver: DemoReceiver) -> None:
    """Subscribes `target`, writes an invoice and a payment with psql, waits for both
    deliveries (30 s at most) and deletes the subscription."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api, headers=headers, timeout=30) as client:
        created = await client.post("/api/v1/webhooks/", json={
            "resource": "invoices", "events": "invoice.create, payment.create",
            "target": target})
        if created.status_code != 201:
            raise SystemExit(f"webhooks demo: subscribing failed: {created.status_code} "
                             f"{created.text}")
        sub = created.json()
        print(f"subscribed: {printable_json(json.dumps(sub))}")
        try:
            invoice = _psql(database_url,
                            "INSERT INTO invoices (number, customer, amount, updated_by) "
                            "VALUES ('DEMO-' || floor(random() * 1e6)::int, 'Demo Customer', "
                            "120.00, 'demo') RETURNING id")
            _psql(database_url,
                  f"INSERT INTO payments (invoice_id, amount, card_token, updated_by) "
                  f"VALUES ({int(invoice)}, 120.00, 'tok_never_sent', 'demo')")
            print(f"inserted invoice {printable(invoice)} and a payment with psql; waiting for "
                  "deliveries")
            deadline = time.monotonic() + 30
            while len(receiver.deliveries) < 2 and time.monotonic() < deadline:
                receiver.arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(receiver.arrived.wait(), 1)
        finally:
            await client.delete(f"/api/v1/webhooks/{sub['id']}/")


def _print_deliveries(receiver: DemoReceiver) -> bool:
    """Prints each delivery with its headers; whether every signature verified."""
    verified = True
    for number, (got, body) in enumerate(receiver.deliveries, 1):
        standard, legacy = _verify(receiver.secret, body, got)
        verified = verified and standard and legacy
        print(f"\n--- delivery {number}")
        for name in ("content-type", "user-agent", "webhook-id", "webhook-timestamp",
                     "webhook-signature", "x-hook-signature"):
            print(f"{name}: {printable(got.get(name, ''))}")
        # Indented without being parsed: the payload's text as sent (json would print
        # an amount of 120.00 as 120.0), its control characters escaped.
        try:
            shown = msgspec.json.format(body, indent=2).decode()
        except (msgspec.DecodeError, UnicodeDecodeError):
            shown = body.decode(errors="replace")
        print(printable_json(shown))
        print(f"standard webhooks signature: {'verified' if standard else 'INVALID'}; "
              f"X-Hook-Signature: {'verified' if legacy else 'INVALID'}")
    return verified


async def run_demo(settings: Settings, api: str, token: str | None, token_file: str) -> int:
    """Runs the demo flow and prints what the receiver got; 0 when every signature verified."""
    api = api.rstrip("/")
    stop = asyncio.Event()
    token, own_service = await _ensure_api(settings, api, token, token_file, stop)
    receiver = DemoReceiver()
    runner, target = await _start_receiver(receiver)
    print(f"receiver listening on {target}")
    try:
        await _subscribe_and_write(api, token, target, settings.database_url, receiver)
    finally:
        await runner.cleanup()
    verified = _print_deliveries(receiver)
    if own_service is not None:
        stop.set()
        await own_service
    if len(receiver.deliveries) < 2:
        print(f"\nonly {len(receiver.deliveries)} of 2 deliveries arrived in 30 s: "
              "is a worker running (`make run`)?")
        return 1
    return 0 if verified else 1
