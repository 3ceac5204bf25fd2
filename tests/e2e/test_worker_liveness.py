"""The worker's progress is visible (metrics, `webhooks status`) and its liveness check
fails only when it is stuck: no completed round for WEBHOOKS_LIVENESS_TIMEOUT while the
database answers and work is due; an idle worker or a database outage never fails it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import psycopg

from service import db
from service.api.app import create_app
from service.commands.status import collect, render
from service.worker.liveness import Liveness
from tests.support.api import serving
from tests.support.net import free_port
from tests.support.proxy import Proxy, port_of
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, listen_proof, make_settings, poll, running_worker

FAST = {"listen_check_interval": 0.5, "liveness_timeout": 1.0, "worker_db_timeout": 2.0,
        "poll_interval": 0.5}


def gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the metrics")


async def test_progress_shows_in_metrics_and_status(db_url: str, receiver: Receiver) -> None:
    async with running_worker(db_url, **FAST) as worker:
        port = free_port()
        server = worker.metrics.serve(port, liveness=Liveness(worker.settings, worker).check)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                await poll(lambda: listen_proof(worker) > 0
                           and worker.last_round is not None, what="a round and a proof")
                text = (await client.get("/metrics")).text
                first_proof = gauge(text, "webhooks_worker_listen_proof_timestamp_seconds")
                assert abs(gauge(text, "webhooks_worker_last_round_timestamp_seconds")
                           - time.time()) < 10
                # The proof comes again at its interval, the rounds go on.
                await poll(lambda: listen_proof(worker) > first_proof + 0.4,
                           timeout=5, what="the next proof")
                text = (await client.get("/metrics")).text
                assert gauge(text, "webhooks_worker_listen_proof_timestamp_seconds") \
                    > first_proof
                live = await client.get("/livez")
                assert live.status_code == 200 and live.json()["status"] == "ok"
        finally:
            server.shutdown()
        with db.connect(db_url) as conn:
            def reported() -> list[dict[str, Any]]:
                return [w for w in collect(conn)["workers"] if w["worker"] == worker.name]
            await poll(lambda: reported() and reported()[0]["last_round"] is not None,
                       timeout=5, what="the worker's report in status")
            [mine] = reported()
            assert time.time() - mine["last_round"] < 10
            assert mine["proved_seconds_ago"] < 5
            text = render(collect(conn))
    assert worker.name in text and "last completed round, last LISTEN proof" in text


async def stuck(worker: Any) -> None:
    """Makes the worker's loop stop completing rounds (a stall nothing recovers from, but
    the worker's stop, so that the test ends)."""

    async def step() -> float:
        await worker._stopping.wait()
        return 0.0

    worker._step = step
    worker.wake()


async def test_liveness_fails_only_when_stuck_with_work_due_and_the_database_up(
        db_url: str, conn: psycopg.Connection, receiver: Receiver) -> None:
    subscribe(conn, receiver.url, events=["invoice.create"])
    async with running_worker(db_url, **FAST) as worker:
        liveness = Liveness(worker.settings, worker)
        await poll(lambda: worker.last_round is not None, what="a first round")
        assert liveness.check()[0] == 200
        await stuck(worker)
        # Stuck, but nothing is due: alive (an idle worker is never restarted).
        await poll(lambda: time.time() - (worker.last_round or time.time()) > 1.2,
                   timeout=5, what="the liveness timeout passing")
        assert liveness.check()[0] == 200
        add_invoice(conn, "due")
        # Work due, the database up, no progress: stuck, once that has lasted (a worker
        # resuming after an outage gets the time to).
        status, body = liveness.check()
        assert status == 200 and body["status"] == "recovering", body
        await poll(lambda: liveness.check()[0] == 503, timeout=5, what="a failed check")
        status, body = liveness.check()
        assert body["work_due"] is True and "error" in body
        # The same, served beside the API (`webhooks run`).
        app = create_app(worker.settings, liveness=liveness.check)
        async with serving(worker.settings, app=app) as url, httpx.AsyncClient() as client:
            answer = await client.get(f"{url}/livez")
            assert answer.status_code == 503 and answer.json()["work_due"] is True


async def test_liveness_holds_while_the_database_does_not_answer(
        db_url: str, conn: psycopg.Connection) -> None:
    """The worker made no progress, work is due, but the database hangs: alive (the
    outage is readiness's business), answered within about the worker's deadline."""
    with Proxy(port_of(db_url)) as proxy:
        settings = make_settings(proxy.url(db_url), liveness_timeout=1.0,
                                 worker_db_timeout=2.0, db_connect_timeout=2.0)
        subscribe(conn, events=["invoice.create"])
        add_invoice(conn, "due")

        class Idle:
            started_at = time.time() - 60
            last_round = None

        liveness = Liveness(settings, Idle())
        await poll(lambda: liveness.check()[0] == 503, timeout=5,
                   what="stuck, while the database answers")
        proxy.hang(new=True)
        started = time.monotonic()
        status, body = liveness.check()
        assert status == 200 and body["database"] == "unreachable"
        assert time.monotonic() - started < 6


async def test_webhooks_run_serves_the_workers_liveness_beside_the_api(db_url: str) -> None:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": db_url, "WEBHOOKS_ALLOW_PRIVATE_TARGETS": "true"}
    process = subprocess.Popen([sys.executable, "-m", "service", "run", "--port", str(port)],
                               env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            while True:
                try:
                    answer = await client.get("/livez")
                    text = (await client.get("/metrics")).text
                except httpx.TransportError:
                    answer, text = None, ""
                if answer is not None and answer.json().get("last_round") is not None:
                    break
                assert time.monotonic() < deadline, answer.text if answer else "no answer"
                await asyncio.sleep(0.1)
        assert answer.status_code == 200 and answer.json()["status"] == "ok"
        assert "webhooks_worker_last_round_timestamp_seconds" in text
    finally:
        process.terminate()
        process.wait(timeout=30)
