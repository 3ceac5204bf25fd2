"""The worker delivers what the triggers capture: payload, signatures, what must not be sent."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import subprocess

import psycopg
from standardwebhooks import Webhook

from service.crypto import SecretBox, new_key
from service.http import USER_AGENT
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, metric, numbers, payloads, poll, running_worker


async def test_plain_sql_change_is_delivered_signed(db_url: str, conn: psycopg.Connection,
                                                    receiver: Receiver) -> None:
    sid, secret = subscribe(conn, receiver.url)
    async with running_worker(db_url):
        with psycopg.connect(db_url, autocommit=True) as other:
            other.execute("SET webhooks.user_id = '42'")
            invoice_id = add_invoice(other, "INV-1")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 1)

    req = receiver.deliveries()[0]
    headers = {k.lower(): v for k, v in req.headers.items()}
    assert req.method == "POST"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == USER_AGENT
    Webhook(secret).verify(req.body, req.headers)  # raises when the signature is wrong
    expected = hmac.new(secret.encode(), req.body, hashlib.sha256).hexdigest()
    assert headers["x-hook-signature"] == expected
    assert headers["webhook-id"].startswith("msg_")

    payload = json.loads(req.body)
    event = payload["event"]
    assert event["name"] == "invoice.create"
    assert event["resource"] == "invoices"
    assert event["resource_id"] == invoice_id
    assert event["user_id"] == "42"
    assert "parent" not in event
    assert event["occurred_at"].endswith("Z") and "T" in event["occurred_at"]
    assert isinstance(event["id"], int)
    assert payload["resource"]["number"] == "INV-1"
    assert payload["resource"]["updated_by"] is None  # the row's own nulls stay

    row = conn.execute("SELECT status, attempts, finished_at IS NOT NULL"
                       " FROM webhooks.deliveries").fetchall()
    assert row == [("succeeded", 1, True)]
    last = conn.execute("SELECT last_status, last_success_at IS NOT NULL"
                        " FROM webhooks.subscriptions WHERE id = %s", (sid,)).fetchone()
    assert last == (200, True)
    assert conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone() == (0,)


async def test_psql_client_change_is_delivered(db_url: str, conn: psycopg.Connection,
                                               receiver: Receiver) -> None:
    subscribe(conn, receiver.url)
    async with running_worker(db_url):
        proc = await asyncio.create_subprocess_exec(
            "psql", db_url, "-v", "ON_ERROR_STOP=1", "-q", "-c",
            "INSERT INTO invoices (number, customer, amount) VALUES ('PSQL-1', 'c', 5)",
            stdout=subprocess.DEVNULL)
        assert await proc.wait() == 0
        await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
    payload = payloads(receiver.deliveries())[0]
    assert payload["resource"]["number"] == "PSQL-1"
    assert payload["event"]["user_id"] == "postgres"


async def test_nested_payment_has_parent_and_no_excluded_column(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    subscribe(conn, receiver.url, events=["payment.create"])
    async with running_worker(db_url):
        invoice_id = add_invoice(conn, "INV-P")
        conn.execute("INSERT INTO payments (invoice_id, amount, card_token)"
                     " VALUES (%s, 3, 'tok_secret')", (invoice_id,))
        await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
    payload = payloads(receiver.deliveries())[0]
    assert payload["event"]["name"] == "payment.create"
    assert payload["event"]["resource"] == "payments"
    assert payload["event"]["parent"] == {"resource": "invoices", "resource_id": invoice_id}
    assert "card_token" not in payload["resource"]
    assert b"tok_secret" not in receiver.deliveries()[0].body


async def test_include_row_false_has_no_resource(db_url: str, conn: psycopg.Connection,
                                                 receiver: Receiver) -> None:
    conn.execute("SELECT webhooks.attach('public.invoices', resource => 'invoices',"
                 " noun => 'invoice', tenant_column => 'company_id', include_row => false)")
    subscribe(conn, receiver.url)
    async with running_worker(db_url):
        add_invoice(conn, "INV-NOROW")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
    payload = payloads(receiver.deliveries())[0]
    assert "resource" not in payload
    assert payload["event"]["name"] == "invoice.create"


async def test_rollback_noop_update_and_inactive_send_nothing(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    async with Receiver() as idle:
        subscribe(conn, receiver.url)
        subscribe(conn, idle.url, active=False)
        invoice_id = add_invoice(conn, "BEFORE")  # before the worker: delivered first
        async with running_worker(db_url):
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
            with psycopg.connect(db_url) as tx:
                add_invoice(tx, "ROLLED-BACK")
                tx.rollback()
            conn.execute("UPDATE invoices SET status = status WHERE id = %s", (invoice_id,))
            add_invoice(conn, "MARKER")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 2)
        # The marker came after the rollback and the no-op update, and nothing else did.
        assert numbers(receiver.deliveries()) == ["BEFORE", "MARKER"]
        assert idle.received == []
        assert conn.execute("SELECT count(*) FROM webhooks.deliveries d JOIN"
                            " webhooks.subscriptions s ON s.id = d.subscription_id"
                            " WHERE NOT s.active").fetchone() == (0,)


async def test_tenant_scoped_subscription_gets_only_its_tenant(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    async with Receiver() as everyone:
        subscribe(conn, receiver.url, tenant="acme")
        subscribe(conn, everyone.url)
        async with running_worker(db_url):
            add_invoice(conn, "OTHER-1", company="globex")
            add_invoice(conn, "ACME-1", company="acme")
            add_invoice(conn, "OTHER-2", company="globex")
            add_invoice(conn, "ACME-2", company="acme")
            await everyone.wait_for(lambda r: len(r.deliveries()) == 4)
            await receiver.wait_for(lambda r: len(r.deliveries()) >= 2)
        assert numbers(receiver.deliveries()) == ["ACME-1", "ACME-2"]
        assert sorted(numbers(everyone.deliveries())) == ["ACME-1", "ACME-2",
                                                          "OTHER-1", "OTHER-2"]


async def test_encrypted_secret_signs_with_the_plain_one(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    key = new_key()
    sid, secret = subscribe(conn, receiver.url)
    conn.execute("UPDATE webhooks.subscriptions SET secret = %s WHERE id = %s",
                 (SecretBox(key).seal(secret), sid))
    async with running_worker(db_url, encryption_key=key):
        add_invoice(conn, "SEALED")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
    Webhook(secret).verify(receiver.deliveries()[0].body, receiver.deliveries()[0].headers)


async def test_undecryptable_secret_is_never_sent_unsigned(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    sid, secret = subscribe(conn, receiver.url)
    conn.execute("UPDATE webhooks.subscriptions SET secret = %s WHERE id = %s",
                 (SecretBox(new_key()).seal(secret), sid))
    async with running_worker(db_url, encryption_key=new_key(), retry_schedule=(60.0,)):
        add_invoice(conn, "LOCKED")
        deadline = asyncio.get_running_loop().time() + 10
        while not conn.execute("SELECT count(*) FROM webhooks.attempts").fetchone()[0]:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
    assert receiver.received == []
    last = conn.execute("SELECT last_status, last_failure_content"
                        " FROM webhooks.subscriptions").fetchone()
    assert last is not None and last[0] == 0 and "WEBHOOKS_ENCRYPTION_KEY" in last[1]


async def test_a_light_load_costs_one_round_trip_per_delivery(
        db_url: str, conn: psycopg.Connection) -> None:
    """Between commit and POST the loop makes one round trip: the fan-out and the claim of
    what it made, pipelined in one transaction; a finished attempt that freed a slot
    nobody waited for costs none (this was a fan-out, two claims and a next_due, then a
    claim and a next_due per finished attempt)."""
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        async with running_worker(db_url, poll_interval=30.0) as worker:
            await poll(lambda: worker.wakeup.armed_pid is not None, what="arming")
            await poll(lambda: metric(worker, "webhooks_worker_db_round_trips_total") >= 2)
            before = metric(worker, "webhooks_worker_db_round_trips_total")
            n = 10
            for i in range(n):
                add_invoice(conn, f"L-{i}")
                await receiver.wait_for(lambda r, i=i: len(r.deliveries()) == i + 1)
                await poll(lambda i=i: metric(worker, "webhooks_deliveries_total",
                                                       outcome="succeeded") == i + 1)
            await poll(lambda: metric(worker, "webhooks_worker_outcomes_unwritten") == 0)
            used = metric(worker, "webhooks_worker_db_round_trips_total") - before
            # The rechecks after arming (50, 100, 200 ms ...) cost one each: a few more.
            assert used <= n + 6, used


async def test_a_busy_subscription_claims_several_freed_slots_per_round_trip(
        db_url: str, conn: psycopg.Connection) -> None:
    """One subscription at its cap: each claim waits for a quarter of its slots to free
    (or 50 ms), rather than one claim per finished attempt."""
    async with Receiver() as receiver:
        subscribe(conn, receiver.url, events=["invoice.create"])
        # 64 slots, 48 of them for a lone owner: a quarter stays free, so each finished
        # attempt could pay for a claim of one.
        async with running_worker(db_url, concurrency=64, per_target_concurrency=64,
                                  poll_interval=30.0) as worker:
            await poll(lambda: worker.wakeup.armed_pid is not None, what="arming")
            before = metric(worker, "webhooks_worker_db_round_trips_total")
            conn.execute("INSERT INTO invoices (number, customer, amount)"
                         " SELECT 'B' || g, 'c', 1 FROM generate_series(1, 2000) g")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 2000, timeout=60)
            used = metric(worker, "webhooks_worker_db_round_trips_total") - before
    assert used <= 2000 // 4, used
