"""The service as a guest in someone else's database: whatever `ALTER DATABASE ... SET`
(or `ALTER ROLE`) and the application's sessions say about date styles, time zones,
timeouts, isolation or encodings, the service's connections set their own
(service/db.py SESSION_SETTINGS): the API, the worker and `status` work as with the
server's defaults (tests/support/hostile.py). Retention, the capture and `migrate` under
the same defaults: tests/db/test_guest_retention.py, tests/db/test_guest_capture.py,
tests/db/test_migrate_guest.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

import httpx
import psycopg

from service import tokens
from service.config import Settings
from tests.support.api import serving
from tests.support.hostile import (
    hostile_defaults,  # noqa: F401  (the fixture `hostile`)
    writer,
)
from tests.support.receivers import Receiver
from tests.support.worker import payloads, poll, running_worker

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


@asynccontextmanager
async def api_on(url: str, conn: psycopg.Connection) -> AsyncIterator[httpx.AsyncClient]:
    """The API serving `url`, with a client holding a token for alice (made on `conn`)."""
    token = tokens.create(conn, "alice")[1]
    settings = Settings(database_url=url, allow_private_targets=True, verify_timeout=2.0)
    async with serving(settings) as base, httpx.AsyncClient(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}) as http:
        yield http


async def test_the_api_and_the_worker_deliver_under_hostile_defaults(
        hostile: str, conn: psycopg.Connection) -> None:
    async with Receiver() as receiver, api_on(hostile, conn) as http:
        response = await http.post("/api/v1/webhooks/", json={
            "resource": "invoices", "events": "invoice.create", "target": receiver.url})
        assert response.status_code == 201, response.text
        sid = response.json()["id"]
        response = await http.get("/api/v1/webhooks/")
        assert response.status_code == 200, response.text
        assert [s["id"] for s in response.json()] == [sid]

        async with running_worker(hostile):
            with writer(hostile) as app:
                app.execute("INSERT INTO invoices (number, customer, amount)"
                            " VALUES ('G-1', 'Zoë ✓', 12.5)")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
            await poll(lambda: conn.execute("SELECT status FROM webhooks.deliveries"
                                            ).fetchall() == [("succeeded",)],
                       what="the delivery recorded")

        [payload] = payloads(receiver.deliveries())
        assert payload["resource"]["number"] == "G-1"
        assert payload["resource"]["customer"] == "Zoë ✓"
        assert payload["resource"]["amount"] == 12.5
        # The row's timestamp in UTC, whatever the writer's or the database's time zone.
        stamp = payload["resource"]["updated_at"]
        assert stamp.endswith("+00:00"), stamp
        row = conn.execute("SELECT updated_at FROM invoices WHERE number = 'G-1'").fetchone()
        assert row is not None and datetime.fromisoformat(stamp) == row[0]
        assert payload["event"]["occurred_at"].endswith("Z")

        # The delivery log and the subscription's last delivery, through the API.
        response = await http.get(f"/api/v1/webhooks/{sid}/deliveries")
        assert response.status_code == 200, response.text
        [listed] = response.json()
        assert listed["status"] == "succeeded" and listed["last_status"] == 200
        assert RFC3339.match(listed["created_at"]) and RFC3339.match(listed["finished_at"])
        response = await http.get(f"/api/v1/webhooks/{sid}/deliveries/{listed['id']}/")
        assert response.status_code == 200, response.text
        assert response.json()["payload"] == payload
        response = await http.get(f"/api/v1/webhooks/{sid}")
        assert response.status_code == 200, response.text
        assert response.json()["last_status"] == 200
        assert RFC3339.match(response.json()["last_success_at"])


def test_status_under_hostile_defaults(hostile: str, conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO webhooks.worker_tasks (worker, task, restarts, last_error,"
                 " last_crash_at) VALUES ('host:1:1', 'listener', 2, 'RuntimeError: boom',"
                 " now() - interval '2 minutes')")
    env = {**os.environ, "DATABASE_URL": hostile}
    done = subprocess.run([sys.executable, "-m", "service", "status", "--json"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [t["restarts"] for t in data["worker_tasks"]] == [2]
    # Partition bounds in ISO and UTC: each day starts at midnight UTC.
    oldest = [p["oldest"] for p in data["partitions"]]
    assert oldest and all(re.fullmatch(r"\d{4}-\d\d-\d\d 00:00:00\+00", o) for o in oldest)
    done = subprocess.run([sys.executable, "-m", "service", "status"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "listener  2 restarts" in done.stdout
