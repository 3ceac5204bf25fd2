"""The SSRF guard runs again at every delivery, against what the target resolves to then."""

from __future__ import annotations

import asyncio
import time

import psycopg

from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe, subscription
from tests.support.worker import add_invoice, running_worker


async def wait_for_attempt(conn: psycopg.Connection, sid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while subscription(conn, sid)["last_failure_at"] is None:
        assert time.monotonic() < deadline, "no attempt was recorded in time"
        await asyncio.sleep(0.05)


PRIVATE_FORMS = ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "2130706433", "0x7f.0.0.1"]


async def test_private_targets_are_refused_at_delivery(db_url: str, conn: psycopg.Connection
                                                       ) -> None:
    async with Receiver() as receiver:
        port = receiver.url.split(":")[-1].split("/")[0]
        # Stored directly: as if its DNS answer changed to a private address after the
        # handshake, or the guard was off when it was created. One subscription per form.
        sids = {host: subscribe(conn, f"http://{host}:{port}/hook")[0]
                for host in PRIVATE_FORMS}
        async with running_worker(db_url, allow_private_targets=False):
            add_invoice(conn, "SSRF-1")
            for sid in sids.values():
                await wait_for_attempt(conn, sid)
        for host, sid in sids.items():
            row = subscription(conn, sid)
            assert row["last_status"] == 0, host
            content = row["last_failure_content"] or ""
            # Names and literals are refused by the guard; the URL library itself already
            # rejects the numeric forms that only some resolvers expand (2130706433).
            assert any(word in content for word in ("loopback", "non-public", "private",
                                                    "not a canonical IPv4")), (host, content)
            if host == "localhost":
                # What a name resolves to is never told: no internal-DNS oracle.
                assert "127.0.0.1" not in content and "::1" not in content, content
        assert receiver.received == []


async def test_the_same_target_is_delivered_when_private_targets_are_allowed(
        db_url: str, conn: psycopg.Connection) -> None:
    async with Receiver() as receiver:
        sid, _ = subscribe(conn, receiver.url.replace("127.0.0.1", "localhost"))
        async with running_worker(db_url, allow_private_targets=True):
            add_invoice(conn, "SSRF-2")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
        assert subscription(conn, sid)["last_status"] == 200
