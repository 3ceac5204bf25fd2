"""A PostgreSQL restart in the middle of a stream, and a failover to a synchronous standby
(pg_basebackup, pg_ctl promote) whose old primary's connections hang: on private
clusters these tests start themselves. Every change committed is delivered within the
bound, and once the database accepts connections again no API request fails."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import httpx
import psycopg
import pytest

from tests.support.api import Api, api_for
from tests.support.cluster import Cluster
from tests.support.proxy import Proxy
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import poll, running_worker

FAST = {"worker_db_timeout": 1.5, "listen_check_interval": 1.0, "db_connect_timeout": 2.0,
        "db_tcp_timeout": 5.0, "poll_interval": 0.5}
BOUND = 30.0


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster.primary() as running:
        running.install()
        yield running


@dataclass
class Writer:
    """Inserts invoices one after another on a connection of its own to `url` (which the
    test may change), reconnecting after an error; the database's table is the truth of
    what was committed."""

    url: str
    attempts: int = 0
    task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                        self.url, autocommit=True, connect_timeout=2) as conn:
                    url = self.url
                    while url == self.url:
                        self.attempts += 1
                        async with asyncio.timeout(3):
                            await conn.execute(
                                "INSERT INTO invoices (number, customer, amount)"
                                " VALUES (%s, 'c', 1)", (f"n{self.attempts}",))
                        await asyncio.sleep(0.02)
            except (psycopg.Error, OSError, TimeoutError):
                await asyncio.sleep(0.05)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Writer]:
        self.task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@dataclass
class Prober:
    """GETs the subscriptions page again and again, recording (sent at, status)."""

    api: Api
    answers: list[tuple[float, int]] = field(default_factory=list)
    # Cleared while the fault happens: the API is idle then, so that its pooled
    # connections meet the database again only once it is back (as a quiet API does).
    going: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.api.url, headers=self.api.auth(),
                                     timeout=60) as client:
            # Several connections in the pool first.
            await asyncio.gather(*(client.get("/api/v1/webhooks/") for _ in range(6)))
            while True:
                await self.going.wait()
                sent = time.monotonic()
                response = await client.get("/api/v1/webhooks/")
                self.answers.append((sent, response.status_code))
                await asyncio.sleep(0.02)

    def failed_after(self, moment: float) -> list[tuple[float, int]]:
        return [(t - moment, s) for t, s in self.answers if t >= moment and s != 200]


def committed(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT number FROM invoices").fetchall()}


def delivered(receiver: Receiver) -> set[str]:
    return {json.loads(r.body)["resource"]["number"] for r in receiver.deliveries()}


async def stream_across(fault: object, *, write_url: str, service_url: str,
                        receiver: Receiver, after: object = None
                        ) -> tuple[float, float, Prober]:
    """Runs a worker and an API on `service_url` while a writer streams rows to
    `write_url`; `fault()` happens in the middle (it returns the moment the database is
    back); `after()`, if given, then moves the writer. Returns how long after that moment
    the last committed row was delivered, and the API prober."""
    writer = Writer(write_url)
    async with running_worker(service_url, **FAST), \
            api_for(service_url, api_db_timeout=5.0, db_connect_timeout=2.0) as api:
        prober = Prober(api)
        prober.going.set()
        probing = asyncio.create_task(prober.run())
        try:
            async with writer.running():
                await poll(lambda: len(receiver.deliveries()) >= 20, timeout=20,
                           what="the stream under way")
                prober.going.clear()
                await asyncio.sleep(0.1)  # the request under way, if any, ends
                back = await asyncio.to_thread(fault)  # type: ignore[arg-type]
                prober.going.set()
                if after is not None:
                    writer.url = after()  # type: ignore[operator]
                written = len(committed(writer.url))
                await poll(lambda: len(committed(writer.url)) >= written + 20, timeout=20,
                           what="rows written after the fault")
            truth = committed(writer.url)
            await poll(lambda: truth <= delivered(receiver), timeout=BOUND,
                       what="every committed row delivered")
            took = time.monotonic() - back
            await poll(lambda: sum(1 for t, _ in prober.answers if t >= back) >= 10,
                       timeout=BOUND, what="API requests answered after the fault")
        finally:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing
    return back, took, prober


async def test_a_restart_mid_stream_loses_nothing_and_fails_no_request_after_it(
        cluster: Cluster, receiver: Receiver) -> None:
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        subscribe(conn, receiver.url, events=["invoice.create"])

    def restart() -> float:
        cluster.restart("fast")
        return time.monotonic()

    back, took, prober = await stream_across(restart, write_url=cluster.url,
                                             service_url=cluster.url, receiver=receiver)
    assert [s for t, s in prober.answers if t >= back], "no request after the restart"
    assert prober.failed_after(back) == []
    assert committed(cluster.url) <= delivered(receiver)
    assert took < BOUND
    print(f"restart: every committed row delivered {took:.1f}s after the database was back")


async def test_failover_to_a_synchronous_standby_with_the_old_primary_hanging(
        receiver: Receiver) -> None:
    """The service reaches the primary through a proxy (its address); the primary's
    connections hang and it vanishes, the synchronous standby is promoted and the address
    leads to it: every row committed on the old primary or the new one is delivered within
    the bound, and no API request sent once the new primary answers fails."""
    with Cluster.primary(synchronous=True) as primary, primary.standby() as standby, \
            Proxy(primary.port) as proxy:
        primary.install()
        with psycopg.connect(primary.url, autocommit=True) as conn:
            subscribe(conn, receiver.url, events=["invoice.create"])
        await poll(lambda: _replicated(primary), timeout=20, what="the standby streaming")

        def fail_over() -> float:
            proxy.hang(new=True)  # the old primary's host is gone: nothing answers
            primary.stop("immediate")
            standby.promote()
            proxy.forward(to_port=standby.port)  # the address leads to the new primary
            return time.monotonic()

        back, took, prober = await stream_across(
            fail_over, write_url=primary.url, service_url=proxy.url(primary.url),
            receiver=receiver, after=lambda: standby.url)
        assert committed(standby.url) <= delivered(receiver)
        assert [s for t, s in prober.answers if t >= back], "no request after the failover"
        assert prober.failed_after(back) == []
        assert took < BOUND
    print(f"failover: every committed row delivered {took:.1f}s after the promotion")


def _replicated(primary: Cluster) -> bool:
    with psycopg.connect(primary.url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_replication"
                           " WHERE sync_state = 'sync'").fetchone()
    return row == (1,)
