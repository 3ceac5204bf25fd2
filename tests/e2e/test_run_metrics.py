"""`webhooks run` (the API and a worker in one process): one /metrics shows the API's series
and the worker's, kept up to date."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import psycopg

from tests.support.net import free_port
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice


async def test_one_metrics_page_for_the_api_and_the_worker(db_url: str) -> None:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": db_url, "WEBHOOKS_ALLOW_PRIVATE_TARGETS": "true",
           "WEBHOOKS_RETRY_SCHEDULE": "50ms"}
    process = subprocess.Popen([sys.executable, "-m", "service", "run", "--port", str(port)],
                               env=env, stderr=subprocess.DEVNULL)
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            subscribe(conn)  # to a target nothing answers on: an attempt that fails
            add_invoice(conn, "INV-METRICS")
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            while True:
                try:
                    text = (await client.get("/metrics")).text
                except httpx.TransportError:
                    text = ""
                if ('webhooks_deliveries_total{outcome="retry"}' in text
                        and "webhooks_handshakes_total" in text):
                    break
                assert time.monotonic() < deadline, text[-2000:]
                await asyncio.sleep(0.1)
        assert "webhooks_deliveries_due" in text and "webhooks_outbox_statements" in text
    finally:
        process.terminate()
        process.wait(timeout=30)
