"""Database connections that die without an error (a TCP proxy, tests/support/proxy.py,
between the service and PostgreSQL): the worker resumes, nothing committed is lost, the
API answers within its bound and serves again once connections work (the server's own
bounds on an abandoned backend, which the service's connections set by default:
tests/db/test_abandoned_backends.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from service.store import DeadlineExceeded, Store, StoreUnavailable, make_pool
from tests.support.api import api_for
from tests.support.proxy import Proxy, port_of
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import (
    add_invoice,
    listen_connections,
    listen_proof,
    poll,
    running_worker,
    worker_env,
)

# Short deadlines, so that each case takes seconds; the bound checked is the service's
# (30 s for the worker), not these.
FAST = {"worker_db_timeout": 1.5, "listen_check_interval": 1.0, "db_connect_timeout": 2.0,
        "db_tcp_timeout": 5.0, "poll_interval": 0.5}
WORKER_BOUND = 30.0
WEBHOOKS = str(Path(sys.executable).with_name("webhooks"))


@pytest.fixture
def proxy(db_url: str) -> Iterator[Proxy]:
    with Proxy(port_of(db_url)) as running:
        yield running


def numbers_received(receiver: Receiver) -> set[str]:
    import json
    return {json.loads(r.body)["resource"]["number"] for r in receiver.deliveries()}


def outbox_rows(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone()
    assert row is not None
    return int(row[0])


async def requests_in_flight_done(conn: psycopg.Connection) -> None:
    """Waits until no other session of the database runs a statement, twice in a row. A
    request the worker sent just before a fault has reached the server and runs there: a
    fan-out and claim whose transaction began then leases rows committed after the fault,
    and its answer never arrives, so they wait out their lease (a minute) as designed. The
    rows a test commits after this are ones only a request after the fault could take."""
    def quiet() -> bool:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity"
                           " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                           " AND state = 'active'").fetchone()
        return row == (0,)

    calm = 0

    def settled() -> bool:
        nonlocal calm
        calm = calm + 1 if quiet() else 0
        return calm >= 2

    await poll(settled, timeout=10, what="the requests in flight at the fault finished")


def backends_through(conn: psycopg.Connection, application: str) -> int:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND application_name = %s",
                       (application,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("fault", ["hang", "reset"])
async def test_worker_resumes_when_its_connections_stop_answering(
        db_url: str, conn: psycopg.Connection, receiver: Receiver, proxy: Proxy,
        fault: str) -> None:
    """Every connection of the worker (pools and LISTEN) stops answering, or is reset;
    rows committed afterwards are delivered within the bound, each once."""
    subscribe(conn, receiver.url, events=["invoice.create"])
    async with running_worker(proxy.url(db_url), **FAST) as worker:
        add_invoice(conn, "before")
        await receiver.wait_for(lambda r: len(r.deliveries()) >= 1, timeout=10)
        first_listener = listen_connections(worker)
        getattr(proxy, fault)()
        faulted = time.monotonic()
        await requests_in_flight_done(conn)
        for n in range(5):
            add_invoice(conn, f"after-{n}")
        await receiver.wait_for(lambda r: len(r.deliveries()) >= 6, timeout=WORKER_BOUND)
        took = time.monotonic() - faulted
        # The LISTEN connection was replaced too, and proves itself again.
        await poll(lambda: listen_connections(worker) > first_listener, timeout=10,
                   what="a new LISTEN connection")
        proved = listen_proof(worker)
        await poll(lambda: listen_proof(worker) != proved, timeout=10,
                   what="a proof of the new LISTEN connection")
    assert numbers_received(receiver) == {"before", *(f"after-{n}" for n in range(5))}
    ids = [r.headers["webhook-id"] for r in receiver.deliveries()]
    assert len(ids) == len(set(ids)) == 6
    assert took < WORKER_BOUND
    print(f"{fault}: delivered {took:.1f}s after the fault")


async def test_a_hung_listen_connection_is_found_out_and_the_outbox_polled_meanwhile(
        db_url: str, conn: psycopg.Connection, receiver: Receiver, proxy: Proxy) -> None:
    """Only the LISTEN connection hangs (the pools' connections were made directly): its
    proof fails within the interval and the deadline, it is replaced, and a change
    committed while it hangs is delivered by polling, before any NOTIFY could come."""
    subscribe(conn, receiver.url, events=["invoice.create"])
    async with running_worker(db_url, **{**FAST, "poll_interval": 60.0}) as worker:
        worker.listener._url = proxy.url(db_url)  # its next connection goes through it
        old_pid = worker.listener.pid
        conn.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
        await poll(lambda: worker.listener.connected.is_set()
                   and worker.listener.pid != old_pid, timeout=10, what="relisten")
        connections = listen_connections(worker)
        proxy.hang(new=True)
        add_invoice(conn, "while-hung")
        await receiver.wait_for(lambda r: len(r.deliveries()) >= 1, timeout=10)
        # The hung connection failed its proof and was given up (its replacements hang
        # too until the proxy forwards again).
        await poll(lambda: not worker.listener.connected.is_set(), timeout=10,
                   what="the hung LISTEN connection given up")
        proxy.forward()
        await poll(lambda: listen_connections(worker) > connections, timeout=15,
                   what="a working LISTEN connection again")
    assert numbers_received(receiver) == {"while-hung"}


async def test_the_api_answers_503_within_its_bound_and_serves_again(
        db_url: str, proxy: Proxy) -> None:
    """Every connection to the database hangs (new ones too): a request answers 503 with
    a JSON error and Retry-After within WEBHOOKS_API_DB_TIMEOUT (with a margin), and once
    new connections work, every request succeeds, the first one included."""
    bound = 2.0
    async with api_for(proxy.url(db_url), api_db_timeout=bound,
                       db_connect_timeout=2.0) as api:
        assert (await api.request("GET", "/api/v1/webhooks/")).status_code == 200
        proxy.hang(new=True)
        started = time.monotonic()
        answers = await asyncio.gather(*(api.request("GET", "/api/v1/webhooks/")
                                         for _ in range(3)))
        took = time.monotonic() - started
        for down in answers:
            assert down.status_code == 503, down.text
            assert set(down.json()) == {"error"}
            assert int(down.headers["retry-after"]) > 0
        assert took < bound + 1.5, f"held {took:.1f}s"
        proxy.forward()
        statuses = [(await api.request("GET", "/api/v1/webhooks/")).status_code
                    for _ in range(20)]
        assert statuses == [200] * 20
    print(f"API: 503 after {took:.2f}s (bound {bound}s)")


async def test_pooled_connections_the_server_closed_are_replaced_before_use(
        db_url: str, conn: psycopg.Connection) -> None:
    """Every idle pooled connection is terminated by the server (as at a restart): the
    next reads all succeed, none on a dead connection."""
    pool = make_pool(db_url, min_size=4, max_size=4, name="t-closed")
    await pool.open(wait=True)
    try:
        store = Store(pool, 2.0)
        await asyncio.gather(*(store.ping() for _ in range(8)))
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE datname = current_database() AND application_name = "
                     "'webhooks-t-closed'")
        await poll(lambda: backends_through(conn, "webhooks-t-closed") == 0, timeout=10,
                   what="the terminated backends gone")
        for _ in range(8):
            await store.ping()
    finally:
        await pool.close()


async def test_a_statement_on_a_hung_connection_is_abandoned_and_cancelled(
        db_url: str, conn: psycopg.Connection, proxy: Proxy) -> None:
    """A statement whose connection stops answering ends at its deadline with
    DeadlineExceeded; the statement is cancelled on the server (which the cancel request,
    on a new connection through the proxy, still reaches) and the pool goes on."""
    pool = make_pool(proxy.url(db_url), min_size=1, max_size=2, name="t-hung")
    await pool.open(wait=True)
    try:
        store = Store(pool, 1.0)
        await store.ping()
        async with store.session() as s:
            task = asyncio.ensure_future(s._execute(sql.SQL("SELECT pg_sleep(30)")))
            await poll(lambda: sleeping(conn) == 1, timeout=5, what="the statement running")
            proxy.hang()
            started = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                await task
            assert time.monotonic() - started < 1.5
        await poll(lambda: sleeping(conn) == 0, timeout=10,
                   what="the abandoned statement cancelled on the server")
        await store.ping()  # a new connection
    finally:
        await pool.close()


def sleeping(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND state = 'active' AND query LIKE "
                       "'SELECT pg_sleep(30)%'").fetchone()
    assert row is not None
    return int(row[0])


async def test_a_worker_process_with_the_default_deadlines_resumes_within_the_bound(
        db_url: str, conn: psycopg.Connection, receiver: Receiver, proxy: Proxy,
        tmp_path: Path) -> None:
    """`webhooks worker` as deployed (its database deadlines the defaults): every
    connection it holds stops answering, and rows committed afterwards are delivered
    within 30 s."""
    subscribe(conn, receiver.url, events=["invoice.create"])
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [WEBHOOKS, "worker", "--concurrency", "8"], stdout=out, stderr=out,
            env=worker_env(proxy.url(db_url)))
    try:
        add_invoice(conn, "before")
        await receiver.wait_for(lambda r: len(r.deliveries()) >= 1, timeout=30)
        await poll(lambda: backends_through(conn, "webhooks-listener") == 1, timeout=10,
                   what="the worker listening")
        proxy.hang()
        faulted = time.monotonic()
        await requests_in_flight_done(conn)
        for n in range(5):
            add_invoice(conn, f"after-{n}")
        try:
            await receiver.wait_for(lambda r: len(r.deliveries()) >= 6, timeout=WORKER_BOUND)
        except AssertionError as exc:
            # What the worker said, and where each delivery stands, tell why.
            rows = conn.execute("SELECT id, status, attempts, next_attempt_at,"
                                " lease_expires_at FROM webhooks.deliveries ORDER BY id"
                                ).fetchall()
            raise AssertionError(f"{exc}; received {sorted(numbers_received(receiver))};"
                                 f" deliveries {rows}; outbox rows {outbox_rows(conn)};"
                                 f" worker log:\n{log.read_text()[-6000:]}") from None
        took = time.monotonic() - faulted
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert numbers_received(receiver) == {"before", *(f"after-{n}" for n in range(5))}
    assert took < WORKER_BOUND, log.read_text()[-3000:]
    print(f"worker process, default deadlines: delivered {took:.1f}s after the hang")


async def test_with_the_default_deadlines_a_request_is_answered_within_10_s(
        db_url: str, proxy: Proxy) -> None:
    async with api_for(proxy.url(db_url)) as api:
        assert (await api.request("GET", "/api/v1/webhooks/")).status_code == 200
        proxy.hang(new=True)
        started = time.monotonic()
        down = await api.request("GET", "/api/v1/webhooks/")
        took = time.monotonic() - started
    assert down.status_code == 503 and set(down.json()) == {"error"}
    assert "retry-after" in down.headers
    assert took < 10.0, f"held {took:.1f}s"
    print(f"API, default deadlines: 503 after {took:.2f}s")


async def test_a_transaction_abandoned_behind_a_hung_proxy_releases_its_locks(
        db_url: str, conn: psycopg.Connection, proxy: Proxy) -> None:
    """The cancel request cannot pass a proxy that hangs every connection, and the server
    still sees its end of the abandoned connection alive: its transaction, idle, ends at
    idle_in_transaction_session_timeout (the service's default: a minute; 3 s here, set by
    the URL's options as an operator may) and the row it locked is free again."""
    sid, _ = subscribe(conn)
    url = proxy.url(db_url)
    url += ("&" if "?" in url else "?") + "options=-c%20idle_in_transaction_session_timeout%3D3s"
    pool = make_pool(url, min_size=1, max_size=1, name="t-hung-tx")
    await pool.open(wait=True)
    try:
        store = Store(pool, 0.5)
        with pytest.raises(StoreUnavailable):
            async with store.transaction() as s:
                await s._execute(sql.SQL(
                    "SELECT 1 FROM webhooks.subscriptions WHERE id = {} FOR UPDATE"
                ).format(sid))
                proxy.hang(new=True)
                await s.ping()

        def free() -> bool:
            row = conn.execute("SELECT count(*) FROM (SELECT 1 FROM webhooks.subscriptions"
                               " WHERE id = %s FOR UPDATE SKIP LOCKED) x", (sid,)).fetchone()
            conn.rollback()
            return row == (1,)

        assert not free()  # still held by the abandoned transaction
        await poll(free, timeout=10, what="the abandoned transaction's lock released")
    finally:
        await pool.close()


async def test_a_statement_abandoned_while_the_server_sends_releases_its_locks(
        db_url: str, conn: psycopg.Connection, proxy: Proxy) -> None:
    """A backend stopped in the middle of a result, its client's proxy no longer reading,
    is neither idle (no idle timeout ends it) nor cancellable (a cancel waits until it
    can write again), and holds its transaction's locks as long as the proxy holds on: the
    fan-out's advisory lock held that way stopped the fan-out of every worker. The next
    connection that works ends the abandoned one's backend."""
    key = 736_451
    pool = make_pool(proxy.url(db_url), min_size=1, max_size=2, name="t-hung-send")
    await pool.open(wait=True)

    def held() -> bool:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                           " AND objid = %s AND granted", (key,)).fetchone()
        return row != (0,)

    try:
        store = Store(pool, 3.0)
        statement = store.session()

        async def send_a_lot() -> None:
            async with statement as s:
                await s._execute(sql.SQL(
                    "WITH l AS MATERIALIZED (SELECT pg_advisory_xact_lock({})),"
                    " w AS MATERIALIZED (SELECT pg_sleep(1) FROM l)"
                    " SELECT repeat('x', 1000000) FROM w, generate_series(1, 64)"
                ).format(key))

        sending = asyncio.ensure_future(send_a_lot())
        await poll(held, timeout=10, what="the statement's lock taken")
        proxy.hang()  # these connections stop; new ones are forwarded
        with pytest.raises(StoreUnavailable):
            await sending
        assert held(), "the abandoned statement's lock was released before a checkout"
        await store.ping()  # the next connection that works ends the abandoned backend
        await poll(lambda: not held(), timeout=10,
                   what="the abandoned statement's lock released")
    finally:
        await pool.close()
