"""Creating subscriptions: validation order, event names, the handshake, the SSRF guard."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from aiohttp import web

from service import store
from service.config import Settings
from service.crypto import SecretBox, new_key
from tests.e2e.test_handshake import closed_port
from tests.support.api import Api, api_for, assert_error, serving
from tests.support.receivers import Received, Receiver, echo_secret, status

pytestmark = pytest.mark.api_settings(verify_timeout=0.5)


async def post(api: Api, body: Any) -> httpx.Response:
    return await api.request("POST", "/api/v1/webhooks", json=body)


def stored(api: Api) -> int:
    return int(api.sql("SELECT count(*) FROM webhooks.subscriptions")[0][0])


async def test_validation_order_resource_events_target(api: Api) -> None:
    bad = {"resource": "nope", "events": "explode", "target": "ftp://x"}
    assert_error(await post(api, bad), 400, "unknown resource 'nope'")
    assert_error(await post(api, {**bad, "resource": "invoices"}), 400, "invoice.explode")
    assert_error(await post(api, {**bad, "resource": "invoices", "events": "create"}), 400,
                 "http")
    assert api.receiver.received == [] and stored(api) == 0


BAD_RESOURCE_OR_EVENTS = [
    ("payments", "create", "unknown resource 'payments'"),  # nested: offered under invoices
    ("", "create", "unknown resource"),
    ("invoices", "", "empty"),
    ("invoices", " , ", "empty"),
    ("invoices", "order.create", "not an event of resource 'invoices'"),
    ("invoices", "invoice.create,payment.explode", "payment.explode"),
    ("invoices", "invoice", "invoice.invoice"),
]


async def test_bad_resource_or_events(api: Api) -> None:
    for resource, events, fragment in BAD_RESOURCE_OR_EVENTS:
        body = {"resource": resource, "events": events, "target": api.receiver.url}
        message = assert_error(await post(api, body), 400, fragment)
        if "unknown resource" in fragment:
            assert "invoices" in message  # names what can be subscribed to
    assert stored(api) == 0


async def test_private_events_are_refused(api: Api) -> None:
    api.sql("SELECT webhooks.attach('public.payments', resource => 'payments', "
            "noun => 'payment', parent_resource => 'invoices', parent_column => 'invoice_id', "
            "public => false)")
    body = {"resource": "invoices", "events": "create,payment.create",
            "target": api.receiver.url}
    assert_error(await post(api, body), 400, "not public")


async def test_bare_verbs_under_a_resource_without_own_table(api: Api) -> None:
    api.sql("SELECT webhooks.detach('public.invoices')")
    body = {"resource": "invoices", "events": "create", "target": api.receiver.url}
    assert_error(await post(api, body), 400, "bare verb")
    created = await api.create(events="payment.create")
    assert created["events"] == "payment.create"


async def test_events_canonical_order_and_aliases(api: Api) -> None:
    created = await api.create(events="destroy , payment.destroy,invoice.delete, update ,")
    assert created["events"] == "invoice.delete,payment.delete,invoice.update"


async def failed_handshake(api: Api, behaviour: Any, fragment: str,
                           target: str | None = None) -> str:
    api.receiver.behaviour = behaviour
    body = {"resource": "invoices", "events": "create", "target": target or api.receiver.url}
    message = assert_error(await post(api, body), 400, fragment)
    assert message.startswith("target verification failed")
    for request in api.receiver.received:
        assert request.headers["x-hook-secret"] not in message
    assert stored(api) == 0
    return message


async def test_handshake_failures_are_400_and_store_nothing(api: Api) -> None:
    async def silent(req: Received) -> web.StreamResponse:
        return web.Response(status=200)

    await failed_handshake(api, silent, "did not echo")
    await failed_handshake(api, status(200, {"X-Hook-Secret": "whsec_other"}), "differs")
    await failed_handshake(api, status(500), "HTTP 500")
    async with Receiver() as other:
        await failed_handshake(api, status(301, {"Location": other.url}), "redirect (301")
        assert other.received == []
    await failed_handshake(api, echo_secret, "refused",
                           target=f"http://127.0.0.1:{closed_port()}/hook")


async def test_handshake_timeout(api: Api) -> None:
    release = asyncio.Event()

    async def hang(req: Received) -> web.StreamResponse:
        await asyncio.wait_for(release.wait(), 10)
        return await echo_secret(req)

    started = time.monotonic()
    try:
        await failed_handshake(api, hang, "within 0.5 seconds")
    finally:
        release.set()
    assert time.monotonic() - started < 5


async def test_no_connection_is_held_during_the_handshake(db_url: str) -> None:
    """With a pool of one connection, other requests run while a handshake waits."""
    release = asyncio.Event()

    async def slow(req: Received) -> web.StreamResponse:
        await asyncio.wait_for(release.wait(), 10)
        return await echo_secret(req)

    receiver = await Receiver(behaviour=slow).start()
    pool = store.make_pool(db_url, max_size=1)
    await pool.open(wait=True)
    try:
        settings = Settings(database_url=db_url, allow_private_targets=True, verify_timeout=8)
        async with serving(settings, pool=pool) as url, \
                httpx.AsyncClient(base_url=url, timeout=30) as http:
            api = Api(url, http, db_url, "", receiver)
            api.token = api.new_token("alice")
            creating = asyncio.create_task(api.request("POST", "/api/v1/webhooks", json={
                "resource": "invoices", "events": "create", "target": receiver.url}))
            await receiver.wait_for(lambda r: len(r.received) == 1)
            started = time.monotonic()
            listed = await api.request("GET", "/api/v1/webhooks")
            assert listed.status_code == 200 and listed.json() == []
            assert time.monotonic() - started < 2
            release.set()
            assert (await creating).status_code == 201
    finally:
        release.set()
        await pool.close()
        await receiver.stop()


# That the API puts a target through the SSRF guard (and a NUL through the body's check)
# before any request, and stores nothing; every form the guard refuses, and why:
# tests/unit/test_ssrf.py.
@pytest.mark.parametrize(("target", "fragment"), [
    ("{receiver}", "loopback"),
    ("http://169.254.169.254/latest/meta-data", "link-local"),
    ("ftp://example.com/hook", "http"),
    ("http://user@127.0.0.1:{port}/hook", "user name"),
    ("http://exa\x00mple.com/", "NUL"),
])
async def test_ssrf_guard_refuses_private_targets(db_url: str, target: str,
                                                  fragment: str) -> None:
    async with api_for(db_url, allow_private_targets=False) as api:
        port = api.receiver.url.split(":")[2].split("/")[0]
        url = target.format(receiver=api.receiver.url, port=port)
        body = {"resource": "invoices", "events": "create", "target": url}
        message = assert_error(await post(api, body), 400, fragment)
        assert "verification" not in message  # refused before any request
        assert api.receiver.received == [] and stored(api) == 0


async def test_secret_is_sealed_when_a_key_is_configured(db_url: str) -> None:
    key = new_key()
    async with api_for(db_url, encryption_key=key) as api:
        created = await api.create()
        sent = api.receiver.received[-1].headers["x-hook-secret"]
        [(stored,)] = api.sql("SELECT secret FROM webhooks.subscriptions WHERE id = %s",
                              created["id"])
        assert stored.startswith("fernet:") and sent not in stored
        assert SecretBox(key).open(stored) == sent
