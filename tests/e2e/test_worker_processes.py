"""`webhooks worker --processes N` and `webhooks api --processes N`: N processes on one
host, one command to stop them, and a child that dies is started again (a worker child's
command line: tests/unit/test_processes.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psycopg

from service.commands.processes import api_child_argv
from tests.support.net import free_port
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import poll, worker_env

WEBHOOKS = str(Path(sys.executable).with_name("webhooks"))


def listener_count(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND application_name = 'webhooks-listener'"
                       ).fetchone()
    return int(row[0]) if row else 0


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def listening(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on TCP port `port`."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    except OSError:
        return False
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes:
            return True
    return False


async def test_processes_deliver_together_restart_a_dead_child_and_stop_cleanly(
        db_url: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    async with Receiver() as receiver:
        subscribe(conn, receiver.url, events=["invoice.create"])
        log = tmp_path / "workers.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                WEBHOOKS, "worker", "--processes", "2", "--concurrency", "8",
                env=worker_env(db_url), stdout=out, stderr=out)
        try:
            await poll(lambda: listener_count(conn) == 2, timeout=30,
                       what="two worker processes listening")
            assert len(children(proc.pid)) == 2
            conn.execute("INSERT INTO invoices (number, customer, amount)"
                         " SELECT 'P' || g, 'c', 1 FROM generate_series(1, 300) g")
            await receiver.wait_for(lambda r: len(r.deliveries()) >= 300, timeout=30)
            # A child that dies is started again (after its backoff, a second).
            victim = children(proc.pid)[0]
            os.kill(victim, signal.SIGKILL)
            await poll(lambda: victim not in children(proc.pid)
                       and len(children(proc.pid)) == 2, timeout=20,
                       what="the dead child replaced")
            await poll(lambda: listener_count(conn) == 2, timeout=30,
                       what="the new child listening")
            conn.execute("INSERT INTO invoices (number, customer, amount)"
                         " SELECT 'Q' || g, 'c', 1 FROM generate_series(1, 100) g")
            await receiver.wait_for(lambda r: len(r.deliveries()) >= 400, timeout=30)
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30)
        assert code == 0, log.read_text()
        await poll(lambda: listener_count(conn) == 0, timeout=10, what="children gone")
    ids = [r.headers["webhook-id"] for r in receiver.deliveries()]
    assert len(set(ids)) == 400




def healthz(port: int, timeout: float = 10.0) -> int:
    """The status of GET /healthz on a new connection (0: no answer within `timeout`
    seconds: a replacement process may take its first request while a loaded machine
    still starts it)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz",
                                    timeout=timeout) as resp:
            return int(resp.status)
    except (OSError, urllib.error.URLError):
        return 0


async def test_api_processes_share_one_port_and_one_that_dies_is_replaced(
        db_url: str, tmp_path: Path) -> None:
    port = free_port()
    assert api_child_argv("127.0.0.1", port)[1:] == [
        "-m", "service", "api", "--processes", "1", "--reuse-port", "--host", "127.0.0.1",
        "--port", str(port)]
    log = tmp_path / "api.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            WEBHOOKS, "api", "--processes", "2", "--port", str(port),
            env=worker_env(db_url), stdout=out, stderr=out)
    try:
        # Both listening before one is killed: while a loaded machine still starts the
        # second, the first alone answers, and killing it would leave nobody on the port.
        await poll(lambda: len(kids := children(proc.pid)) == 2
                   and all(listening(kid, port) for kid in kids) and healthz(port) == 200,
                   timeout=30, what="two API processes serving")
        victim = children(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        await poll(lambda: victim not in children(proc.pid), timeout=20,
                   what="the dead child reaped")
        # The other process holds the port meanwhile: every request is answered (in
        # time: 30 s, as the whole test suite loads a 2-core machine meanwhile).
        statuses = [healthz(port, timeout=30) for _ in range(20)]
        assert statuses == [200] * 20, statuses
        await poll(lambda: len(children(proc.pid)) == 2, timeout=20,
                   what="the dead child replaced")
        assert healthz(port) == 200
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0, log.read_text()
    assert healthz(port) == 0
