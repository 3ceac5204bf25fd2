"""WEBHOOKS_DELIVERY_PROXY: every delivery and verification handshake goes through the
proxy by CONNECT to the address the SSRF guard checked (never to the name, which the
proxy would look up itself), the host name still in Host; a target whose name resolves
to a private address is refused with the proxy set; a proxy that refuses is a failed
attempt with status 0 and its answer; its password is in no log line or record."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.support.api import api_for, assert_error
from tests.support.connect_proxy import ConnectProxy
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, poll, running_worker

PASSWORD = "Zq9xKv7Wj2Qm"  # no run of four letters of it in any message the tests read


def by_name(url: str) -> str:
    """The receiver's URL with its host written as a name that resolves to it."""
    parts = urlsplit(url)
    return url.replace(f"//{parts.hostname}:", "//localhost:", 1)


async def failure(conn: psycopg.Connection, sid: int) -> tuple[int, str]:
    """The subscription's last failure, once there is one."""
    query = ("SELECT last_status, last_failure_content FROM webhooks.subscriptions"
             " WHERE id = %s AND last_failure_at IS NOT NULL")
    await poll(lambda: conn.execute(query, (sid,)).fetchone(), what="a failed attempt")
    row = conn.execute(query, (sid,)).fetchone()
    assert row is not None
    return row[0], row[1]


def connect_target(url: str) -> str:
    return f"127.0.0.1:{urlsplit(url).port}"


async def test_handshakes_and_deliveries_go_through_the_proxy_by_address(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with ConnectProxy(credentials=f"hooks:{PASSWORD}") as proxy, \
            api_for(db_url, delivery_proxy=proxy.url) as api:
        target = by_name(api.receiver.url)
        created = await api.request("POST", "/api/v1/webhooks/", json={
            "resource": "invoices", "events": "invoice.create", "target": target})
        assert created.status_code == 201, created.text
        # The handshake went through the proxy, with its credentials, to the address.
        assert proxy.tunnels() == [connect_target(target)]
        assert proxy.asked[0].authorization is not None
        [handshake] = api.receiver.received
        assert handshake.headers["Host"] == f"localhost:{urlsplit(target).port}"
        async with running_worker(db_url, delivery_proxy=proxy.url):
            with psycopg.connect(db_url, autocommit=True) as conn:
                add_invoice(conn, "INV-PROXIED")
            await api.receiver.wait_for(lambda r: len(r.deliveries()) == 1)
        assert len(proxy.tunnels()) >= 2
        assert set(proxy.tunnels()) == {connect_target(target)}
        delivery = api.receiver.deliveries()[0]
        assert delivery.headers["Host"] == f"localhost:{urlsplit(target).port}"
    assert PASSWORD[:8] not in caplog.text and PASSWORD[-8:] not in caplog.text


async def test_a_private_target_is_refused_with_the_proxy_set(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    async with ConnectProxy() as proxy:
        async with api_for(db_url, delivery_proxy=proxy.url,
                           allow_private_targets=False) as api:
            refused = await api.request("POST", "/api/v1/webhooks/", json={
                "resource": "invoices", "events": "invoice.create",
                "target": by_name(receiver.url)})
            assert_error(refused, 400, "only public addresses are allowed")
        # A subscription made before the rule held: refused at delivery, no tunnel asked.
        sid, _ = subscribe(conn, by_name(receiver.url), events=["invoice.create"])
        async with running_worker(db_url, delivery_proxy=proxy.url,
                                  allow_private_targets=False):
            add_invoice(conn, "INV-PRIVATE")

            status, content = await failure(conn, sid)
        assert status == 0 and "only public addresses are allowed" in content, content
        assert proxy.tunnels() == [] and receiver.received == []


@pytest.mark.parametrize("refusal", ["407", "502"])
async def test_a_proxy_that_refuses_is_a_failed_attempt_with_its_answer(
        db_url: str, conn: psycopg.Connection, receiver: Receiver, refusal: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # 407: the proxy wants credentials the service does not have; 502: it fails itself.
    async with ConnectProxy(credentials=f"other:{PASSWORD}" if refusal == "407" else None,
                            refuse=None if refusal == "407" else 502) as proxy:
        given = proxy.url if refusal == "502" else \
            proxy.url.replace(f"other:{PASSWORD}", f"hooks:{PASSWORD}x")
        sid, _ = subscribe(conn, receiver.url, events=["invoice.create"])
        async with running_worker(db_url, delivery_proxy=given):
            add_invoice(conn, "INV-REFUSED")

            status, content = await failure(conn, sid)
        assert status == 0 and refusal in content and "proxy" in content, content
        assert proxy.tunnels() and receiver.received == []
        [(attempt_error,)] = conn.execute("SELECT error FROM webhooks.attempts LIMIT 1"
                                          ).fetchall()
        for text in (content, attempt_error, caplog.text):
            assert PASSWORD[:8] not in text and PASSWORD[-8:] not in text
