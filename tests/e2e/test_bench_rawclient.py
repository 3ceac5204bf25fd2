"""The bench's raw HTTP clients (bench/rawclient.py), each posting to a real receiver on
127.0.0.1: the worker's own HTTP client among them, the bench's reference for what
sending costs of a delivery."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.support.receivers import Receiver


@pytest.mark.parametrize("lib", ["aiohttp", "curl"])
async def test_a_raw_client_posts_the_bench_body_and_reports_its_rate(lib: str) -> None:
    async with Receiver() as receiver:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.rawclient", "rate", "--url", receiver.url,
            "--lib", lib, "--concurrency", "4", "--duration", "0.3",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        result = json.loads(out.decode().strip().splitlines()[-1])
        # Every request it counted reached the receiver (plus the warm-up's four).
        assert result["requests"] > 0
        assert len(receiver.received) == result["requests"] + 4
        assert result["cpu_us"] > 0
        body = json.loads(receiver.received[-1].body)
        assert body["resource"]["pad"] == "x" * 400
        assert receiver.received[-1].headers["Content-Type"] == "application/json"
