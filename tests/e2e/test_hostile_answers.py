"""Whatever a target answers is recorded, and no answer wedges the recorder or a slot.

The targets here are raw TCP servers on 127.0.0.1 that write exactly the bytes a test
gives them: NUL bytes, invalid UTF-8, compressed bodies, huge and malformed headers,
malformed Retry-After values. The one sanitizer of recorded text, alone:
tests/unit/test_pg_text.py; a batch of outcomes the database refuses, split and the rest
recorded: tests/db/test_delivery.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import psycopg
import pytest

from service.worker import delivery
from service.worker.delivery import BODY_LIMIT
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe, subscription
from tests.support.worker import add_invoice, poll, running_worker


@dataclasses.dataclass
class RawTarget:
    """An HTTP target that answers every request with `answer(n)` (n counts from 1)."""

    answer: Callable[[int], bytes]
    requests: list[bytes] = dataclasses.field(default_factory=list)
    url: str = ""
    _server: asyncio.Server | None = None

    async def start(self) -> RawTarget:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            self.requests.append(head)
            writer.write(self.answer(len(self.requests)))
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def http(status: str, headers: list[bytes], body: bytes = b"") -> bytes:
    """A raw HTTP/1.1 answer; Content-Length is added, the connection is closed after."""
    lines = [b"HTTP/1.1 " + status.encode(), *headers,
             b"Content-Length: " + str(len(body)).encode(), b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


ERROR_PAGE = b"<html><body>Internal error \xe2\x80\x94 try later</body></html>" * 20

# Answers that once made the batched record fail forever, or crashed the parsing.
POISON: dict[str, bytes] = {
    "nul": http("500 Internal Server Error", [], b"bad\x00body\x00"),
    "invalid-utf8": http("500 Internal Server Error", [], b"\xff\xfe\xc3(\xa0\xa1 \xed\xa0\x80"),
    "gzip": http("500 Internal Server Error", [b"Content-Encoding: gzip"],
                 gzip.compress(ERROR_PAGE)),
    "deflate": http("502 Bad Gateway", [b"Content-Encoding: deflate"],
                    zlib.compress(ERROR_PAGE)),
    "gzip-lie": http("500 Internal Server Error", [b"Content-Encoding: gzip"],
                     b"\x1f\x8b\x08\x00 not gzip at all \x00\xff"),
    "huge-header": http("500 Internal Server Error", [b"X-Junk: " + b"A" * 200_000], b"x"),
    "many-headers": http("500 Internal Server Error",
                         [b"X-H%d: v" % i for i in range(5000)], b"x"),
    "nul-header": http("500 Internal Server Error", [b"X-Bad: a\x00b"], b"x"),
    "binary-header": http("500 Internal Server Error", [b"X-Bin: \xff\xfe\x80\x00"], b"x"),
    "no-colon": http("500 Internal Server Error", [b"this is not a header"], b"x"),
    "bad-status": b"HTTP/1.1 5x0 \x00\xff\r\nContent-Length: 0\r\n\r\n",
    "garbage": b"\x00\x01\x02\xff" * 100,
    "nul-retry-after": http("503 Service Unavailable", [b"Retry-After: 1\x00"], b"x"),
    "binary-reason": http("500 \xff\xfe\x00 bad", [], b"\x00"),
}


@asynccontextmanager
async def raw_targets(answers: dict[str, bytes]) -> AsyncIterator[dict[str, RawTarget]]:
    targets = {name: await RawTarget(lambda _n, a=answer: a).start()
               for name, answer in answers.items()}
    try:
        yield targets
    finally:
        for target in targets.values():
            await target.stop()


def attempts_by_sub(conn: psycopg.Connection) -> dict[int, list[tuple[int, str | None]]]:
    rows = conn.execute("SELECT subscription_id, status, error FROM webhooks.attempts"
                        " ORDER BY id").fetchall()
    found: dict[int, list[tuple[int, str | None]]] = {}
    for sid, status, error in rows:
        found.setdefault(sid, []).append((status, error))
    return found


async def test_every_hostile_answer_is_recorded_and_healthy_work_flows(
        db_url: str, conn: psycopg.Connection) -> None:
    async with Receiver() as healthy:
        async with raw_targets(POISON) as targets:
            subs = {subscribe(conn, t.url, events=["invoice.create"])[0]: name
                    for name, t in targets.items()}
            healthy_sid, _ = subscribe(conn, healthy.url, events=["invoice.create"])
            # One try each: the first attempt's outcome must be recorded, then it is final.
            async with running_worker(db_url, retry_schedule=(60.0,), concurrency=32):
                add_invoice(conn, "HOSTILE-1")
                await healthy.wait_for(lambda r: len(r.deliveries()) == 1)
                await poll(lambda: set(attempts_by_sub(conn)) >= set(subs),
                           what="an attempt recorded for every hostile target")
                add_invoice(conn, "HOSTILE-2")  # the recorder still writes afterwards
                await healthy.wait_for(lambda r: len(r.deliveries()) == 2)
                await poll(lambda: conn.execute(
                    "SELECT count(*) FROM webhooks.deliveries WHERE subscription_id = %s"
                    " AND status = 'succeeded'", (healthy_sid,)).fetchone() == (2,),
                    what="healthy deliveries recorded")
                await poll(lambda: all(len(a) == 2 for sid, a in attempts_by_sub(conn).items()
                                       if sid in subs), what="second attempts recorded")
        for sid, name in subs.items():
            row = subscription(conn, sid)
            content = row["last_failure_content"]
            assert content, name
            assert "\x00" not in content, name
            assert len(content) <= BODY_LIMIT, name
            content.encode("utf-8")  # valid text
            # Each delivery went once: an unrecorded outcome would come back by lease.
            assert len(targets[name].requests) <= 2, name
        statuses = {name: subscription(conn, sid)["last_status"] for sid, name in subs.items()}
        assert statuses["nul"] == 500 and statuses["gzip"] == 500
        assert statuses["deflate"] == 502
        gz = subscription(conn, next(s for s, n in subs.items() if n == "gzip"))
        # The compressed bytes are kept as they came (made printable), never inflated.
        assert "Internal error" not in gz["last_failure_content"]


async def test_deliveries_ask_for_no_compression(db_url: str, conn: psycopg.Connection
                                                 ) -> None:
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        async with running_worker(db_url):
            add_invoice(conn, "IDENTITY")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
        headers = {k.lower(): v for k, v in receiver.deliveries()[0].headers.items()}
        assert headers.get("accept-encoding") == "identity"


# Retry-After values (raw bytes) that once raised outside the attempt's error handling;
# tests/unit/test_retry.py tries many more malformed ones against the parser.
BAD_RETRY_AFTER: list[bytes] = [
    "\u00b2".encode(),  # a superscript two: a digit to str.isdigit(), not to float()
    b"Fri, 31 Dec 99999999999999999999 23:59:59 GMT",  # a year past any C long
    "\u2460\u2461".encode(),  # circled digits
    b"Sat, 01 Jan 100000000000000000000000 00:00:00 +0000",
    "1\u00b3".encode(),
]


async def test_malformed_retry_after_never_costs_a_slot(db_url: str, conn: psycopg.Connection
                                                        ) -> None:
    def answer(n: int) -> bytes:
        value = BAD_RETRY_AFTER[n % len(BAD_RETRY_AFTER)]
        code = "429 Too Many Requests" if n % 2 else "503 Service Unavailable"
        return http(code, [b"Retry-After: " + value], b"slow down")

    bad = await RawTarget(answer).start()
    healthy = await Receiver().start()
    concurrency = 4
    try:
        subscribe(conn, bad.url, events=["invoice.create"])
        async with running_worker(db_url, concurrency=concurrency, retry_after_cap=0.2,
                                  retry_schedule=(0.05,) * 5):
            for n in range(3 * concurrency):
                add_invoice(conn, f"RA{n}")
            await poll(lambda: len(bad.requests) > 3 * concurrency, timeout=15,
                       what="more malformed answers than the worker has slots")
            subscribe(conn, healthy.url, events=["invoice.create"])
            add_invoice(conn, "HEALTHY")
            await healthy.wait_for(lambda r: len(r.deliveries()) == 1, timeout=10)
    finally:
        await bad.stop()
        await healthy.stop()
    statuses = {s for (s,) in conn.execute("SELECT DISTINCT status FROM webhooks.attempts"
                                           " WHERE error = 'slow down'").fetchall()}
    assert statuses == {429, 503}


async def test_a_crashed_attempt_is_recorded_and_retried(
        db_url: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("unexpected bug")

    monkeypatch.setattr(delivery, "signed_headers", explode)
    async with Receiver() as receiver:
        sid, _ = subscribe(conn, receiver.url)
        async with running_worker(db_url, concurrency=2, retry_schedule=(0.05, 0.05)):
            for n in range(4):
                add_invoice(conn, f"CRASH{n}")
            await poll(lambda: conn.execute(
                "SELECT count(*) FROM webhooks.deliveries WHERE status = 'failed'"
            ).fetchone() == (4,), timeout=15, what="every delivery failed after its retries")
            # The worker still has all its slots.
            monkeypatch.undo()
            add_invoice(conn, "AFTER")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
    rows = conn.execute("SELECT attempt, status, error FROM webhooks.attempts"
                        " WHERE status = 0 ORDER BY delivery_id, attempt").fetchall()
    assert len(rows) == 12  # 4 deliveries x (1 try + 2 retries)
    assert all("RuntimeError" in (error or "") for _, _, error in rows)
    assert subscription(conn, sid)["last_status"] == 200
