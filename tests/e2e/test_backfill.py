"""Backfill: every current row delivered once as `<noun>.snapshot` through
the normal queue, with the subscription's tenant scope, excluded columns and filter; short
batches that resume after a killed worker and leave the application's writers alone; the
API's answers to bad requests (the backfill's SQL functions called directly, without a
worker: tests/db/test_backfill_sql.py)."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp import web

from tests.support.api import Api, assert_error
from tests.support.backfills import backfill_status
from tests.support.receivers import Received, Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import payloads, poll, running_worker, worker_env

WEBHOOKS = str(Path(sys.executable).with_name("webhooks"))


def snapshots(receiver: Receiver, name: str | None = None) -> list[dict[str, Any]]:
    """Bodies of the snapshot deliveries received (of event `name` when given)."""
    return [p for p in payloads(receiver.deliveries())
            if p["event"]["name"].endswith(".snapshot")
            and (name is None or p["event"]["name"] == name)]


async def finished(api: Api, sid: int, bid: int, timeout: float = 30.0) -> dict[str, Any]:
    """The backfill once it is no longer running."""
    found: dict[str, Any] = {}

    async def check() -> bool:
        response = await api.request("GET", f"/api/v1/webhooks/{sid}/backfills/{bid}")
        assert response.status_code == 200, response.text
        found.update(response.json())
        return found["status"] != "running"

    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"backfill still running after {timeout}s: {found}"
        await asyncio.sleep(0.05)
    return found


async def test_every_row_as_a_snapshot_with_tenant_scope_and_excluded_columns(api: Api) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO invoices (number, customer, amount, company_id, updated_by)"
                     " SELECT 'B' || g, 'c', g, CASE WHEN g % 3 = 0 THEN 'other' ELSE 'acme' END,"
                     "        CASE WHEN g % 2 = 0 THEN 'u' || g END"
                     "   FROM generate_series(1, 30) g")
        conn.execute("INSERT INTO payments (invoice_id, amount, company_id, card_token)"
                     " SELECT i.id, 1, i.company_id, 'tok_secret' FROM invoices i")
    # A tenant-scoped token: its integrator must see acme's rows only.
    token = api.new_token("alice", "acme")
    sub = await api.create("invoice.create,payment.update", token=token)
    sid = sub["id"]
    async with running_worker(api.db_url):
        response = await api.request("POST", f"/api/v1/webhooks/{sid}/backfill", json={},
                                     token=token)
        assert response.status_code == 202, response.text
        started = response.json()
        assert set(started) == {"id", "status"} and started["status"] == "running"
        done = await finished(api, sid, started["id"])
        assert done["status"] == "done", done
        assert done["rows"] == 40  # 20 acme invoices, 20 acme payments
        assert done["error"] is None and done["finished_at"] is not None
        assert done["tables"] == [
            {"resource": "invoices", "rows": 20, "scanned": 20, "done": True},
            {"resource": "payments", "rows": 20, "scanned": 20, "done": True}]
        await api.receiver.wait_for(lambda r: len(snapshots(r)) >= 40, timeout=20)

    invoices = snapshots(api.receiver, "invoice.snapshot")
    payments = snapshots(api.receiver, "payment.snapshot")
    # Each once, acme's only, their first attempts started in id order (with several in
    # flight they may arrive in another).
    acme = [g for g in range(1, 31) if g % 3 != 0]
    assert sorted(p["event"]["resource_id"] for p in invoices) == acme
    assert sorted(p["event"]["resource_id"] for p in payments) == acme
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        first_attempts = conn.execute(
            "SELECT e.name, (e.body::jsonb -> 'event' ->> 'resource_id')::int"
            "  FROM webhooks.attempts a JOIN webhooks.deliveries d ON d.id = a.delivery_id"
            "  JOIN webhooks.events e ON e.id = d.event_id"
            " WHERE a.attempt = 1 ORDER BY a.attempted_at, a.delivery_id").fetchall()
    for name in ("invoice.snapshot", "payment.snapshot"):
        assert [rid for n, rid in first_attempts if n == name] == acme, name
    invoices.sort(key=lambda p: p["event"]["resource_id"])
    payments.sort(key=lambda p: p["event"]["resource_id"])
    assert all(p["resource"]["company_id"] == "acme" for p in invoices + payments)
    first = invoices[0]
    assert first["event"]["resource"] == "invoices"
    assert first["event"]["user_id"] is None  # no user column value: null, never a role
    assert invoices[1]["event"]["user_id"] == "u2"
    assert "parent" not in first["event"]
    assert set(first["resource"]) == {"id", "company_id", "number", "customer", "amount",
                                      "status", "updated_by", "updated_at"}
    # Payments: nested under their invoice; the excluded column never leaves the database.
    assert payments[0]["event"]["parent"] == {"resource": "invoices", "resource_id": 1}
    assert all("card_token" not in p["resource"] for p in payments)
    assert all(b"tok_secret" not in r.body for r in api.receiver.deliveries())
    # Through the normal queue: signed, and in the delivery log.
    assert all("webhook-signature" in r.headers for r in api.receiver.deliveries())
    response = await api.request("GET", f"/api/v1/webhooks/{sid}/deliveries?"
                                        "event=payment.snapshot&limit=1000", token=token)
    assert len(response.json()) == 20
    assert {d["status"] for d in response.json()} == {"succeeded"}

    # The list shows it; a second backfill may start once the first is done (paths work
    # with and without their trailing slash).
    response = await api.request("GET", f"/api/v1/webhooks/{sid}/backfills/", token=token)
    assert [b["id"] for b in response.json()] == [started["id"]]
    response = await api.request("POST", f"/api/v1/webhooks/{sid}/backfill/", json={},
                                 token=token)
    assert response.status_code == 202, response.text
    response = await api.request(
        "GET", f"/api/v1/webhooks/{sid}/backfills/{response.json()['id']}/", token=token)
    assert response.status_code == 200 and response.json()["status"] == "running"


async def test_filter_applies_to_snapshots(api: Api) -> None:
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO invoices (number, customer, amount, status)"
                     " SELECT 'F' || g, 'c', g, CASE WHEN g % 4 = 0 THEN 'paid' ELSE 'draft' END"
                     "   FROM generate_series(1, 40) g")
    response = await api.request("POST", "/api/v1/webhooks/", json={
        "resource": "invoices", "events": "invoice.update", "target": api.receiver.url,
        "filter": {"status": "paid", "amount": {"gte": 10}}})
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    async with running_worker(api.db_url):
        response = await api.request("POST", f"/api/v1/webhooks/{sid}/backfill", json={})
        assert response.status_code == 202, response.text
        done = await finished(api, sid, response.json()["id"])
        assert done["status"] == "done" and done["rows"] == 8, done
        assert done["tables"][0]["scanned"] == 40
        await api.receiver.wait_for(lambda r: len(snapshots(r)) >= 8, timeout=20)
    assert [p["resource"]["number"] for p in snapshots(api.receiver)] == \
        [f"F{g}" for g in range(12, 41, 4)]
    # A snapshot is no update: "$changed" lets every row through, the other conditions hold.
    response = await api.request("POST", "/api/v1/webhooks/", json={
        "resource": "invoices", "events": "invoice.update", "target": api.receiver.url,
        "filter": {"$changed": ["status"], "status": "draft"}})
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    async with running_worker(api.db_url):
        response = await api.request("POST", f"/api/v1/webhooks/{sid}/backfill", json={})
        done = await finished(api, sid, response.json()["id"])
    assert done["status"] == "done" and done["rows"] == 30, done


async def test_bad_requests(api: Api) -> None:
    sub = await api.create("invoice.create")
    sid = sub["id"]
    base = f"/api/v1/webhooks/{sid}"
    for body, fragment in ((b'{"since": "now"}', "unknown field"), (b"[]", "JSON object"),
                           (b"{", "not valid JSON"), (b"", "empty")):
        response = await api.request("POST", f"{base}/backfill", content=body,
                                     headers={**api.auth(),
                                              "Content-Type": "application/json"})
        assert_error(response, 400, fragment)
    # Unknown ids, another owner's and another tenant's subscription: 404.
    assert_error(await api.request("POST", "/api/v1/webhooks/999999/backfill", json={}), 404)
    assert_error(await api.request("POST", "/api/v1/webhooks/x/backfill", json={}), 404)
    assert_error(await api.request("POST", f"{base}/backfill", json={},
                                   token=api.new_token("mallory")), 404)
    tenant_sub = await api.create("invoice.create", token=api.new_token("alice", "acme"))
    assert_error(await api.request("POST", f"/api/v1/webhooks/{tenant_sub['id']}/backfill",
                                   json={}, token=api.new_token("alice", "globex")), 404)
    assert_error(await api.request("GET", f"{base}/backfills/1"), 404)
    assert_error(await api.request("GET", f"{base}/backfills/abc"), 404)
    # Inactive: 409.
    response = await api.request("PUT", f"{base}/", json={"active": False})
    assert response.status_code == 200, response.text
    assert_error(await api.request("POST", f"{base}/backfill", json={}), 409, "inactive")
    response = await api.request("PUT", f"{base}/", json={"active": True})
    # One at a time (no worker runs here, so the first stays running): 409.
    response = await api.request("POST", f"{base}/backfill", json={})
    assert response.status_code == 202, response.text
    bid = response.json()["id"]
    assert_error(await api.request("POST", f"{base}/backfill", json={}), 409,
                 f"backfill {bid}")
    # Another subscription's backfill id is unknown here.
    other = await api.create("invoice.update")
    assert_error(await api.request("GET", f"/api/v1/webhooks/{other['id']}/backfills/{bid}"),
                 404)
    # The service's own events have no table to read.
    ops = await api.create("webhook.disabled", resource="webhooks")
    assert_error(await api.request("POST", f"/api/v1/webhooks/{ops['id']}/backfill", json={}),
                 400, "no events of an attached table")


async def test_id_column_of_a_type_not_built_in_is_refused(api: Api) -> None:
    # The keyset comparison would run the type owner's operator with the service's rights.
    api.sql("CREATE DOMAIN public.gadget_id AS bigint;"
            "CREATE TABLE public.gadgets (id public.gadget_id PRIMARY KEY, name text);"
            "INSERT INTO public.gadgets VALUES (1, 'one');"
            "SELECT webhooks.attach('public.gadgets', resource => 'gadgets', noun => 'gadget')")
    sub = await api.create("gadget.create", resource="gadgets")
    error = assert_error(await api.request("POST", f"/api/v1/webhooks/{sub['id']}/backfill",
                                           json={}), 400, "not built into PostgreSQL")
    assert "gadget_id" in error
    # A table that changes its id column's type mid-backfill fails it with the same reason.
    api.sql("CREATE TABLE public.widgets (id bigint PRIMARY KEY, name text);"
            "INSERT INTO public.widgets SELECT g, 'w' FROM generate_series(1, 3) g;"
            "SELECT webhooks.attach('public.widgets', resource => 'widgets', noun => 'widget')")
    sub = await api.create("widget.create", resource="widgets")
    response = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/backfill", json={})
    assert response.status_code == 202
    bid = response.json()["id"]
    api.sql("ALTER TABLE public.widgets ALTER COLUMN id TYPE public.gadget_id")
    async with running_worker(api.db_url):
        done = await finished(api, sub["id"], bid)
    assert done["status"] == "failed" and "not built into PostgreSQL" in done["error"], done


async def test_resumes_after_the_worker_is_killed(db_url: str, conn: psycopg.Connection,
                                                  receiver: Receiver, tmp_path: Path) -> None:
    async def slow(req: Received) -> web.StreamResponse:
        await asyncio.sleep(0.01)
        return web.Response(status=200)

    receiver.behaviour = slow
    total = 3000
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'K' || g, 'c', 1 FROM generate_series(1, %s) g", (total,))
    sid, _ = subscribe(conn, receiver.url, events=["invoice.create"])
    [(bid,)] = conn.execute("SELECT webhooks.start_backfill(%s)", (sid,)).fetchall()
    with (tmp_path / "worker.log").open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            WEBHOOKS, "worker", "--concurrency", "8",
            # One batch ahead of the deliveries: the backfill is still reading at the kill.
            env=worker_env(db_url, WEBHOOKS_LEASE="2", WEBHOOKS_DELIVERY_TIMEOUT="1",
                           WEBHOOKS_BACKFILL_AHEAD="500"),
            stdout=out, stderr=out)
    try:
        await receiver.wait_for(lambda r: len(r.deliveries()) >= 700, timeout=60)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert backfill_status(conn, bid) == "running", "the backfill finished before the kill"
    [(queued_at_kill,)] = conn.execute("SELECT rows FROM webhooks.backfills").fetchall()
    async with running_worker(db_url):
        await poll(lambda: backfill_status(conn, bid) == "done", timeout=60,
                   what="the backfill finished")
        await receiver.wait_for(lambda r: len({p["event"]["resource_id"]
                                               for p in snapshots(r)}) == total, timeout=60)
    # Every row queued exactly once (deliveries may repeat: at-least-once, same id).
    counts = conn.execute("SELECT count(*), count(DISTINCT body::jsonb -> 'event' -> "
                          "'resource_id') FROM webhooks.events").fetchone()
    assert counts == (total, total)
    assert conn.execute("SELECT rows FROM webhooks.backfills").fetchone() == (total,)
    ids = [p["event"]["resource_id"] for p in snapshots(receiver)]
    print(f"\nbackfill of {total} rows: {queued_at_kill} queued when the worker was killed, "
          f"{len(ids) - total} deliveries repeated after the kill")


# -- writers' latency during a 100,000-row backfill --------------------------------------

def _writer(db_url: str, ready: Any, stop: Any, results: Any, seed: int) -> None:
    """Writes to invoices (updates of random rows and inserts) until `stop` is set; sends
    back (start time, latency) of every statement."""
    rng = random.Random(seed)
    samples: list[tuple[float, float]] = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        with ready.get_lock():
            ready.value += 1
        while not stop.is_set():
            started = time.time()
            t0 = time.perf_counter()
            if rng.random() < 0.5:
                conn.execute("UPDATE invoices SET status = %s WHERE id = %s",
                             (rng.choice(("draft", "sent", "paid")), rng.randint(1, 100_000)))
            else:
                conn.execute("INSERT INTO invoices (number, customer, amount)"
                             " VALUES ('W', 'c', 1)")
            samples.append((started, time.perf_counter() - t0))
            time.sleep(0.005)
    results.put(samples)


def _summary(latencies: list[float]) -> str:
    if not latencies:
        return "no writes"
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"{len(ordered)} writes, p50 {statistics.median(ordered) * 1000:.1f} ms, "
            f"p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms")


@pytest.mark.timeout(600)
async def test_writers_latency_during_a_100k_backfill(db_url: str, conn: psycopg.Connection,
                                                      receiver: Receiver,
                                                      tmp_path: Path) -> None:
    """The backfill reads as fast as it can (no pacing by deliveries), so the writers meet
    it at its busiest; every snapshot is queued once, and deliveries flow meanwhile."""
    total = 100_000
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'L' || g, 'c', 1 FROM generate_series(1, %s) g", (total,))
    conn.execute("VACUUM ANALYZE invoices")
    sid, _ = subscribe(conn, receiver.url, events=["invoice.update"])
    context = multiprocessing.get_context("spawn")
    ready, stop, results = context.Value("i", 0), context.Event(), context.Queue()
    writers = [context.Process(target=_writer, args=(db_url, ready, stop, results, n))
               for n in range(2)]
    with (tmp_path / "worker.log").open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            WEBHOOKS, "worker", "--concurrency", "64",
            env=worker_env(db_url, WEBHOOKS_BACKFILL_AHEAD=str(10 * total)),
            stdout=out, stderr=out)
    try:
        for w in writers:
            w.start()
        await poll(lambda: ready.value == len(writers), timeout=60, what="writers connected")
        await asyncio.sleep(3)  # the writers' latency before the backfill
        began = time.time()
        [(bid,)] = conn.execute("SELECT webhooks.start_backfill(%s)", (sid,)).fetchall()
        await poll(lambda: backfill_status(conn, bid) != "running", timeout=300,
                   what="the backfill finished")
        ended = time.time()
        stop.set()
        samples: list[tuple[float, float]] = []
        for _ in writers:
            samples += await asyncio.to_thread(results.get, True, 60)
        for w in writers:
            w.join(30)
        await receiver.wait_for(lambda r: len(snapshots(r)) >= 100, timeout=60)
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
        for w in writers:
            if w.is_alive():
                w.kill()
    assert backfill_status(conn, bid) == "done"
    # Every row that existed at the start (the writers' inserts before it included), queued
    # once, in id order.
    [(until,)] = conn.execute("SELECT until_id::bigint FROM webhooks.backfill_tables"
                              ).fetchall()
    assert until >= total
    queued = conn.execute(
        "SELECT count(*), count(DISTINCT r), min(r), max(r),"
        "       bool_and(r > prev) FILTER (WHERE prev IS NOT NULL)"
        "  FROM (SELECT (body::jsonb -> 'event' ->> 'resource_id')::bigint AS r,"
        "               lag((body::jsonb -> 'event' ->> 'resource_id')::bigint)"
        "                   OVER (ORDER BY id) AS prev"
        "          FROM webhooks.events WHERE name = 'invoice.snapshot') x").fetchone()
    assert queued == (until, until, 1, until, True)
    before = [latency for at, latency in samples if at < began]
    during = [latency for at, latency in samples if began <= at < ended]
    [(rows, batches)] = conn.execute("SELECT rows, batches FROM webhooks.backfills").fetchall()
    print(f"\n{rows} rows backfilled in {ended - began:.1f} s "
          f"({rows / (ended - began):.0f} rows/s, {batches} batches)"
          f"\nwriters before: {_summary(before)}\nwriters during: {_summary(during)}")
    assert before and during
    # Generous: one machine runs the worker, the receiver, the writers and Postgres.
    assert max(during) < 1.0, _summary(during)


async def test_the_openapi_document_describes_backfills(api: Api) -> None:
    doc = (await api.http.get("/schema/openapi.json")).json()
    start = doc["paths"]["/api/v1/webhooks/{webhook_id}/backfill"]["post"]
    assert {"202", "400", "404", "409"} <= set(start["responses"])
    body = start["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/BackfillRequest"}
    body = doc["components"]["schemas"]["BackfillRequest"]
    assert body["additionalProperties"] is False and body["properties"] == {}
    one = doc["paths"]["/api/v1/webhooks/{webhook_id}/backfills/{backfill_id}"]["get"]
    assert one["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Backfill"}
    assert {"id", "status", "rows", "created_at", "finished_at", "error", "tables"} <= set(
        doc["components"]["schemas"]["Backfill"]["properties"])
    assert "/api/v1/webhooks/{webhook_id}/backfills" in doc["paths"]


async def test_two_workers_share_the_batches_and_queue_each_row_once(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    total = 4000
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'D' || g, 'c', 1 FROM generate_series(1, %s) g", (total,))
    sid, _ = subscribe(conn, receiver.url, events=["invoice.create"])
    [(bid,)] = conn.execute("SELECT webhooks.start_backfill(%s)", (sid,)).fetchall()
    async with running_worker(db_url, backfill_ahead=1000), \
            running_worker(db_url, backfill_ahead=1000):
        await poll(lambda: backfill_status(conn, bid) == "done", timeout=60,
                   what="the backfill finished")
        await receiver.wait_for(lambda r: len({p["event"]["resource_id"]
                                               for p in snapshots(r)}) == total, timeout=60)
    counts = conn.execute("SELECT count(*), count(DISTINCT body::jsonb -> 'event' -> "
                          "'resource_id') FROM webhooks.events").fetchone()
    assert counts == (total, total)
    assert conn.execute("SELECT rows, batches FROM webhooks.backfills").fetchone() == (total, 8)
