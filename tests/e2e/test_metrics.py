"""Worker metrics: served by `webhooks worker --metrics-port`, and they move."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import httpx
import psycopg

from tests.support.net import free_port
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, worker_env


def sample(text: str, name: str) -> float:
    """The value of the first sample line starting with `name` (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def scrape(url: str, deadline: float) -> str:
    async with httpx.AsyncClient() as client:
        while True:
            try:
                return (await client.get(url)).text
            except httpx.TransportError:
                assert time.monotonic() < deadline, "metrics server did not come up"
                await asyncio.sleep(0.1)


async def test_worker_metrics_move_after_a_delivery(db_url: str, conn: psycopg.Connection
                                                    ) -> None:
    receiver = await Receiver().start()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "service", "worker", "--metrics-port",
                             str(port)], env=worker_env(db_url))
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        before = await scrape(url, time.monotonic() + 20)
        for name in ("webhooks_deliveries_total", "webhooks_delivery_attempt_seconds_bucket",
                     "webhooks_deliveries_due", "webhooks_oldest_pending_delivery_seconds",
                     "webhooks_outbox_lag_seconds", "webhooks_outbox_statements",
                     "webhooks_worker_db_round_trips_total", "webhooks_worker_db_errors_total",
                     "webhooks_worker_deliveries_leased_by_fanout_total",
                     "webhooks_worker_deliveries_closed_inactive_total",
                     "webhooks_worker_deliveries_released_total",
                     "webhooks_worker_listen_connections_total",
                     "webhooks_worker_outcomes_unwritten"):
            assert f"# TYPE {name.removesuffix('_total').removesuffix('_bucket')}" in before \
                or name in before, name
        subscribe(conn, receiver.url)
        add_invoice(conn, "M-1")
        await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
        deadline = time.monotonic() + 10
        while True:
            after = await scrape(url, deadline)
            ok = 'webhooks_deliveries_total{outcome="succeeded"} 1.0' in after
            if ok or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert ok, after
        assert sample(after, "webhooks_delivery_attempt_seconds_count") == 1.0
        assert sample(after, "webhooks_outbox_changes_processed_total") >= 1.0
        assert sample(after, "webhooks_worker_db_round_trips_total") >= 1.0
        # Supervised tasks: every one is listed, at 0 while none has crashed.
        for task in ("listener", "recorder", "pruner", "loop"):
            line = f'webhooks_worker_task_restarts_total{{task="{task}"}} 0.0'
            assert line in after, task
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        await receiver.stop()
