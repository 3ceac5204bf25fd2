"""`webhooks status` against a known database state."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg

from service.commands.status import collect, render


def seed(conn: psycopg.Connection) -> None:
    conn.execute("""
        INSERT INTO webhooks.subscriptions (owner, resource, events, target, secret, active,
                                            last_status, last_failure_at,
                                            last_failure_content)
        VALUES ('o', 'invoices', '{invoice.create}', 'http://a.example/', 's', true, 500,
                now(), 'HTTP 500: boom'),
               ('o', 'invoices', '{payment.create}', 'http://b.example/', 's', true, 200,
                NULL, NULL),
               ('o', 'invoices', '{invoice.update}', 'http://c.example/', 's', false, 410,
                now(), 'gone')""")
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('S', 'c', 1)")
    conn.execute("INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body) "
                 "VALUES (1, 'invoices', 'invoice.create', now(), '{}')")
    conn.execute("""
        INSERT INTO webhooks.deliveries (event_id, subscription_id, status, attempts,
                                         next_attempt_at, created_at)
        SELECT 1, s.id, v.status, v.attempts, now() + v.due, now() - interval '90 seconds'
          FROM (SELECT min(id) AS id FROM webhooks.subscriptions) s,
               (VALUES ('pending', 0, interval '-1 second'), ('pending', 2, interval '1 hour'),
                       ('failed', 8, interval '0'), ('succeeded', 1, interval '0'))
                 AS v (status, attempts, due)""")
    conn.execute("""
        INSERT INTO webhooks.attempts (delivery_id, subscription_id, attempt, attempted_at,
                                       status, duration_ms, error)
        SELECT d.id, d.subscription_id, 1, now() - interval '5 minutes', v.status, 3, NULL
          FROM (SELECT min(id) AS id, min(subscription_id) AS subscription_id
                  FROM webhooks.deliveries) d,
               (VALUES (500), (500), (0), (200)) AS v (status)""")


def test_status_figures(conn: psycopg.Connection) -> None:
    seed(conn)
    data = collect(conn)
    tables = {a["table"]: a for a in data["attachments"]}
    assert set(tables) == {"invoices", "payments"}
    assert tables["payments"]["hook_resource"] == "invoices"
    assert tables["invoices"]["subscriptions"] == 1 and tables["payments"]["subscriptions"] == 1
    assert data["subscriptions"] == {"active": 2, "inactive": 1, "failing": 1, "filtered": 0,
                                     "strict": 0}
    assert {p["parent"]: p["partitions"] for p in data["partitions"]} == {
        "attempts": 3, "deliveries": 3, "events": 3}
    deliveries = data["deliveries"]
    assert (deliveries["pending"], deliveries["due"], deliveries["retrying"],
            deliveries["failed"]) == (2, 1, 1, 1)
    assert 85 <= float(deliveries["oldest_pending_seconds"]) < 3600
    assert data["last_hour"] == {"attempts": 4, "failures": 3}
    assert [f["failures"] for f in data["failing"]] == [3]
    assert data["failing"][0]["target"] == "http://a.example/"
    assert data["outbox"]["events"] == 1
    text = render(data)
    assert "2 active, 1 inactive, 1 failing now; 0 with a filter, 0 strict" in text
    assert "Partitions      attempts 3 (from " in text
    assert "1 due, 2 pending (1 retrying), 1 failed for good" in text
    assert "payment.create/update/delete/truncate under invoices" in text
    assert "Outbox backlog  1 change in 1 statement" in text
    assert "http://a.example/" in text


def test_status_command(db_url: str, conn: psycopg.Connection) -> None:
    seed(conn)
    env = {**os.environ, "DATABASE_URL": db_url}
    text = subprocess.run([sys.executable, "-m", "service", "status"], env=env,
                          capture_output=True, text=True, check=True).stdout
    assert "Subscriptions   2 active" in text
    raw = subprocess.run([sys.executable, "-m", "service", "status", "--json"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(raw)["deliveries"]["due"] == 1





def test_status_shows_set_aside_changes_and_worker_task_crashes(
        conn: psycopg.Connection) -> None:
    seed(conn)
    conn.execute("""
        INSERT INTO webhooks.rejected_changes (table_name, event, reason, set_aside_at,
                                               row_text)
        SELECT 'invoices', 'invoice.update', 'unsupported Unicode escape ' || g,
               now() - make_interval(mins => g), '{}'
          FROM generate_series(1, 7) g""")
    conn.execute("""
        INSERT INTO webhooks.worker_tasks (worker, task, restarts, last_error, last_crash_at)
        VALUES ('host:1:1', 'listener', 3, 'RuntimeError: boom', now() - interval '2 minutes'),
               ('host:1:1', 'pruner', 1, 'RuntimeError: old', now() - interval '3 days')""")
    data = collect(conn)
    rejected = data["rejected"]
    assert rejected["total"] == 7
    assert [r["reason"] for r in rejected["latest"]] == [
        f"unsupported Unicode escape {g}" for g in range(1, 6)]
    assert [(t["task"], t["restarts"]) for t in data["worker_tasks"]] == [("listener", 3)]
    text = render(data)
    assert "Set-aside changes  7" in text
    assert "invoices  invoice.update  unsupported Unicode escape 1" in text
    assert "unsupported Unicode escape 6" not in text
    assert "host:1:1  listener  3 restarts, last 2.0m ago: RuntimeError: boom" in text
    assert json.loads(json.dumps(data, default=str))["rejected"]["total"] == 7


def test_status_with_nothing_set_aside(conn: psycopg.Connection) -> None:
    data = collect(conn)
    assert data["rejected"] == {"total": 0, "latest": []}
    assert data["worker_tasks"] == []
    text = render(data)
    assert "Set-aside changes  0" in text
    assert "Worker tasks    no crash in the last day" in text


def test_counts_are_singular_or_plural(conn: psycopg.Connection) -> None:
    conn.execute("""
        INSERT INTO webhooks.subscriptions (owner, resource, events, target, secret, active)
        VALUES ('o', 'invoices', '{invoice.create}', 'http://a.example/', 's', true)""")
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('S', 'c', 1)")
    text = render(collect(conn))
    assert "(1 active subscription," in text and "1 active subscriptions" not in text
    assert "(0 active subscriptions," in text  # payments: nobody subscribes
    assert "Outbox backlog  1 change in 1 statement," in text
    assert "Last hour       0 attempts, 0 failures" in text
