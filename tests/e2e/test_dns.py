"""Name resolution for deliveries: asynchronous (c-ares through aiodns), bounded by its own
timeout, and a hanging name server never holds up other lookups or deliveries (the
settings, WEBHOOKS_DNS_TIMEOUT and WEBHOOKS_DNS_SERVERS: tests/unit/test_config.py).

The hanging name server is a UDP socket on 127.0.0.1 that never answers.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import psycopg
import pytest

from service.ssrf import GuardedResolver, TargetRejected, resolve_checked
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe, subscription
from tests.support.worker import add_invoice, poll, running_worker


@pytest.fixture
def silent_nameserver() -> Iterator[str]:
    """host:port of a DNS server that receives queries and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


async def test_lookup_times_out_and_others_are_not_held_up(silent_nameserver: str) -> None:
    resolver = GuardedResolver(allow_private=True, timeout=1.5,
                               nameservers=[silent_nameserver])
    try:
        started = time.monotonic()
        # Far more hanging lookups than a thread pool of getaddrinfo calls would have.
        hanging = [asyncio.create_task(resolver.resolve(f"h{n}.hangs.example", 443))
                   for n in range(64)]
        await asyncio.sleep(0)
        # A name from the hosts file and a literal resolve at once meanwhile.
        local = await resolver.resolve("localhost", 80)
        assert {r["host"] for r in local} & {"127.0.0.1", "::1"}
        assert time.monotonic() - started < 1.0  # well before the hanging ones give up
        literal = await resolver.resolve("127.0.0.1", 80)
        assert [r["host"] for r in literal] == ["127.0.0.1"]
        results = await asyncio.gather(*hanging, return_exceptions=True)
        elapsed = time.monotonic() - started
        assert all(isinstance(r, OSError) for r in results), results
        assert "no answer within 1.5s" in str(results[0])
        assert 1.4 < elapsed < 4.0  # each lookup bounded by its own timeout, all at once
    finally:
        await resolver.close()


async def test_check_target_lookup_is_bounded(silent_nameserver: str) -> None:
    started = time.monotonic()
    with pytest.raises(TargetRejected, match="does not resolve"):
        await resolve_checked("slow.hangs.example", 80, False, timeout=0.3,
                              nameservers=[silent_nameserver])
    assert time.monotonic() - started < 1.5


async def test_delivery_with_a_hanging_name_server(db_url: str, conn: psycopg.Connection,
                                                   silent_nameserver: str) -> None:
    async with Receiver() as receiver:
        port = receiver.url.split(":")[-1].split("/")[0]
        slow, _ = subscribe(conn, f"http://never.hangs.example:{port}/hook", owner="a")
        by_name, _ = subscribe(conn, f"http://localhost:{port}/by-name", owner="b")
        by_literal, _ = subscribe(conn, receiver.url, owner="c")
        async with running_worker(db_url, dns_servers=(silent_nameserver,), dns_timeout=0.5,
                                  delivery_timeout=5.0, retry_schedule=(60.0,)):
            add_invoice(conn, "DNS-1")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 2)
            await poll(lambda: subscription(conn, slow)["last_failure_at"] is not None,
                       what="the unresolvable target's attempt recorded")
        assert {r.path for r in receiver.deliveries()} == {"/by-name", "/hook"}
        assert subscription(conn, by_name)["last_status"] == 200
        assert subscription(conn, by_literal)["last_status"] == 200
        row = subscription(conn, slow)
        assert row["last_status"] == 0
        assert "no answer within 0.5s" in row["last_failure_content"]
