"""The run's shared state: the bench database, the receiver process, worker processes and
the raw-client limits (measured once per run, reused by the scenarios that compare to them)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

from bench.common import (
    PYTHON,
    Proc,
    Procs,
    cpu_seconds,
    cpu_ticks,
    peak_rss_mb,
    run_queue_seconds,
    wait_until,
)
from bench.receiver import read_port

# The worker's settings in every scenario unless one overrides them. A short shutdown
# grace keeps the run moving when deliveries hang; logs stay at the service's default.
WORKER_ENV = {
    "WEBHOOKS_ALLOW_PRIVATE_TARGETS": "true",
    "WEBHOOKS_SHUTDOWN_GRACE": "1",
    "WEBHOOKS_LOG_LEVEL": "INFO",  # the default; start_worker waits for "worker started"
}


class CpuMark(NamedTuple):
    """The start of a window that Context.cpu_note() measures."""

    proc: float  # the measured process's CPU seconds
    receiver: float
    db: dict[int, float]  # each server process's CPU seconds
    at: float  # time.time()
    waited: float | None  # seconds the measured process waited for a CPU
    ticks: tuple[int, int] | None  # the machine's idle and all CPU ticks


@dataclass
class Context:
    """What a scenario gets: where the database and the receiver are, and how long to run."""

    url: str
    quick: bool
    procs: Procs
    receiver: Proc | None = None
    port: int = 0
    cache: dict[str, Any] = field(default_factory=dict)
    profile_dir: Path | None = None  # --profile: workers and the API run under py-spy
    scenario: str = ""

    def profile_path(self, what: str) -> Path | None:
        """Where the profile of `what` in the current scenario goes (None: no profiling)."""
        if self.profile_dir is None:
            return None
        return self.profile_dir / f"{self.scenario}-{what}.txt"

    # -- the receiver ------------------------------------------------------------------

    def start_receiver(self) -> None:
        """Starts the receiver process and learns its port."""
        self.receiver = self.procs.start("receiver", [PYTHON, "-m", "bench.receiver"],
                                         stdout_pipe=True)
        assert self.receiver.popen.stdout is not None
        self.port = read_port(self.receiver.popen.stdout)

    def target(self, group: str, i: int = 0) -> str:
        """The receiver URL of path group `group` (distinct per `i`)."""
        return f"http://127.0.0.1:{self.port}/{group}/{i}"

    def _get(self, path: str, method: str = "GET") -> Any:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            data = resp.read()
        return json.loads(data) if path.startswith("/stats") else None

    def stats(self) -> dict[str, dict[str, float]]:
        """Receipts per path group: count, first and last (wall-clock seconds)."""
        result: dict[str, dict[str, float]] = self._get("/stats")
        return result

    def count(self, group: str) -> int:
        """How many requests group `group` received since the last reset."""
        return int(self.stats().get(group, {}).get("count", 0))

    def times(self) -> list[tuple[int, float]]:
        """(resource_id, receipt wall-clock time) of every /lat request."""
        return [(int(i), float(t)) for i, t in self._get("/stats/times")]

    def reset_receiver(self) -> None:
        """Clears the receiver's counters."""
        self._get("/reset", method="POST")

    def wait_count(self, group: str, n: int, timeout: float, idle: float = 10.0) -> int:
        """Waits until `group` has `n` receipts, `timeout` passes, or nothing arrives for
        `idle` seconds; returns the count reached."""
        deadline = time.monotonic() + timeout
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            got = self.count(group)
            if got >= n:
                return got
            if got != last:
                last, last_change = got, time.monotonic()
            elif time.monotonic() - last_change > idle:
                break
            time.sleep(0.05)
        return self.count(group)

    # -- workers -----------------------------------------------------------------------

    def start_worker(self, **env: str) -> Proc:
        """Starts `webhooks worker` on the bench database and waits until it listens."""
        proc = self.procs.start(
            "worker", [PYTHON, "-m", "service", "worker"],
            env={"DATABASE_URL": self.url, **WORKER_ENV, **env},
            profile=self.profile_path("worker"))
        # The worker logs "worker started" once its loop runs; give imports time.
        ok = wait_until(lambda: not proc.alive() or "worker started" in _read(proc), 20)
        if not proc.alive() or not ok:
            tail = proc.tail()
            self.procs.stop(proc)
            raise RuntimeError(f"the worker did not start: {tail or 'no output'}")
        # A row committed before the worker LISTENs waits for its catch-up or poll; the
        # scenarios measure a running worker, so they start once it listens.
        wait_until(self._listening, 10, interval=0.05)
        return proc

    def _listening(self) -> bool:
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query ILIKE 'LISTEN%%' AND state = 'idle'").fetchone()
        return bool(row and row[0] > 0)

    @contextmanager
    def worker(self, **env: str) -> Iterator[Proc]:
        """A running worker, stopped (and checked for a crash) when the block ends."""
        proc = self.start_worker(**env)
        try:
            yield proc
            if not proc.alive():
                raise RuntimeError(f"the worker exited: {proc.tail()}")
        finally:
            self.procs.stop(proc)

    def cpu(self, proc: Proc) -> float:
        """CPU seconds the process has used so far (0 when unknown)."""
        return cpu_seconds(proc.main_pid()) or 0.0

    def db_cpu(self) -> dict[int, float]:
        """CPU seconds so far of each server process of the bench database (empty when the
        server is not on this machine, whose /proc then shows none of them)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()").fetchall()]
        return {pid: cpu for pid in pids if (cpu := cpu_seconds(pid)) is not None}

    def cpu_note(self, proc: Proc, before: CpuMark, requests: int = 0) -> str:
        """"worker CPU x% of a core (n us per request), receiver y%, Postgres z%; waited
        for a CPU w%, cores idle v%" since `before` (a cpu_mark() taken at the start of the
        measured window). The last two say whether the measured process was short of CPU
        while the machine had some to spare: on a small machine the scheduler can leave a
        runnable process queued behind another on one core while the other core idles."""
        elapsed = max(time.time() - before.at, 1e-9)
        used = self.cpu(proc) - before.proc
        note = f"{proc.name} CPU {used / elapsed:.0%} of a core"
        if requests:
            note += f" ({1e6 * used / requests:.0f} us per request)"
        if self.receiver is not None:
            note += f", receiver {(self.cpu(self.receiver) - before.receiver) / elapsed:.0%}"
        db1 = self.db_cpu()
        if db1:
            backends = sum(c - before.db.get(pid, 0.0) for pid, c in db1.items()) / elapsed
            note += f", Postgres backends {backends:.0%}"
        waited = run_queue_seconds(proc.main_pid())
        ticks = cpu_ticks()
        if waited is not None and before.waited is not None:
            note += (f"; {proc.name} waited for a CPU {(waited - before.waited) / elapsed:.0%}"
                     " of the time")
        if ticks is not None and before.ticks is not None and ticks[1] > before.ticks[1]:
            idle = (ticks[0] - before.ticks[0]) / (ticks[1] - before.ticks[1])
            note += f", cores idle {idle:.0%}"
        return note

    def cpu_us(self, proc: Proc, before: CpuMark, requests: int) -> float:
        """Microseconds of `proc`'s CPU per request since `before` (a cpu_mark())."""
        return 1e6 * (self.cpu(proc) - before.proc) / max(requests, 1)

    def raw_cpu_us(self) -> float | None:
        """CPU per request of the raw client at its best rate (raw_rate() measures it)."""
        value = self.cache.get("raw_cpu_us")
        return None if value is None else float(value)

    def cpu_mark(self, proc: Proc) -> CpuMark:
        """The start of a window cpu_note() measures."""
        receiver = self.cpu(self.receiver) if self.receiver is not None else 0.0
        return CpuMark(self.cpu(proc), receiver, self.db_cpu(), time.time(),
                       run_queue_seconds(proc.main_pid()), cpu_ticks())

    def rss_mb(self, proc: Proc) -> float | None:
        """The peak RSS of a running process, in MB."""
        return peak_rss_mb(proc.main_pid())

    # -- the raw client ----------------------------------------------------------------

    def raw(self, mode: str, *args: str, timeout: float = 60.0) -> dict[str, Any]:
        """Runs one bench.rawclient measurement in its own process; returns its JSON."""
        argv = [PYTHON, "-m", "bench.rawclient", mode, *args]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                 start_new_session=True)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"raw client {mode} timed out after {timeout:g}s") from None
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"raw client {mode} failed: {tail}")
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result

    def raw_rate(self) -> tuple[float, str]:
        """The best aiohttp POST rate to the receiver (concurrency 16/32/64, asyncio and
        uvloop); returns (rate, description of the best). Quick runs measure it once; full
        runs once per scenario, next to the figure it is compared with, because a shared
        machine's load drifts over minutes."""
        if self.cache.get("raw_rate_for") != (self.scenario if not self.quick else ""):
            self.cache["raw_rate_for"] = self.scenario if not self.quick else ""
            seconds = "1" if self.quick else "3"
            best = (0.0, "")
            rates: dict[str, float] = {}
            for loop in ("asyncio", "uvloop"):
                for c in (16, 64) if self.quick else (16, 32, 64):
                    got = self.raw("rate", "--url", self.target("raw"), "--lib", "aiohttp",
                                   "--loop", loop, "--concurrency", str(c),
                                   "--duration", seconds)
                    r = got["rate"]
                    rates[f"{loop}/c{c}"] = r
                    if r > best[0]:
                        best = (r, f"aiohttp {loop} c={c}, {got['cpu_us']:.0f} us CPU/request")
                        self.cache["raw_cpu_us"] = float(got["cpu_us"])
            self.cache["raw_rate"] = best
            self.cache["raw_rates"] = rates
        rate, desc = self.cache["raw_rate"]
        return float(rate), str(desc)


def _read(proc: Proc) -> str:
    try:
        return proc.log.read_text(errors="replace")
    except OSError:
        return ""
