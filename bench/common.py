"""What every scenario shares: the result record, subprocesses in their own process groups,
the bench database, and small helpers to build attached tables and subscriptions."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from tests.support import subscriptions

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
BENCH_DB = "webhooks_bench"


@dataclass
class Result:
    """One row of the table: the service's figure against the limit measured in the same run."""

    name: str
    service: float | None
    limit: float | None
    unit: str
    target: str
    met: bool | None = None
    ratio: float | None = None
    notes: str = ""
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The object written to bench/results.json."""
        out = {k: getattr(self, k) for k in ("name", "service", "limit", "ratio", "unit",
                                             "target", "met", "notes")}
        if self.error is not None:
            out["error"] = self.error
        return out


def ratio_result(name: str, service: float | None, limit: float | None, unit: str,
                 minimum: float, notes: str = "", ratio: float | None = None) -> Result:
    """A result whose target is `service / limit >= minimum` (or `ratio`, when given: a
    better estimate, such as the median of paired runs' ratios)."""
    if ratio is None:
        ratio = service / limit if service is not None and limit else None
    return Result(name, service, limit, unit, f"ratio ≥ {minimum:g}",
                  None if ratio is None else ratio >= minimum, ratio, notes)


def cpu_result(name: str, worker_us: float, raw_us: float | None, notes: str = ""
               ) -> Result:
    """The worker's CPU per delivery against the raw client's per POST: at most twice."""
    ratio = worker_us / raw_us if raw_us else None
    return Result(name, worker_us, raw_us, "us", "ratio ≤ 2",
                  None if ratio is None else ratio <= 2.0, ratio,
                  notes + "user+system CPU of the worker process from the first commit to "
                  "the last receipt, per delivery; limit = the raw aiohttp client's CPU per "
                  "POST at its best rate, same receiver, same run")


def floor_result(name: str, service: float | None, limit: float | None, unit: str,
                 minimum: float, notes: str = "") -> Result:
    """A result whose target is `service >= minimum` (in `unit`); ratio is service / limit."""
    ratio = service / limit if service is not None and limit else None
    return Result(name, service, limit, unit, f"≥ {minimum:,g} {unit}",
                  None if service is None else service >= minimum, ratio, notes)


def info_result(name: str, service: float | None, limit: float | None, unit: str,
                notes: str = "") -> Result:
    """A row shown for reference, with no target."""
    ratio = service / limit if service is not None and limit else None
    return Result(name, service, limit, unit, "info", None, ratio, notes)


def ceiling_result(name: str, service: float | None, limit: float | None, unit: str,
                   maximum: float, notes: str = "") -> Result:
    """A result whose target is `service <= maximum` (in `unit`); ratio is service / limit."""
    ratio = service / limit if service is not None and limit else None
    return Result(name, service, limit, unit, f"≤ {maximum:g} {unit}",
                  None if service is None else service <= maximum, ratio, notes)


def error_result(name: str, exc: BaseException) -> Result:
    """The row of a scenario that failed: the suite goes on."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:160]
    return Result(name, None, None, "", "", None, None, "", error=text)


def with_dbname(url: str, dbname: str) -> str:
    """The libpq URI `url` pointing at another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


def recreate_database(admin_url: str, dbname: str) -> str:
    """Drops and creates `dbname` on the server of `admin_url`; returns its URI."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(dbname)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    return with_dbname(admin_url, dbname)


def drop_database(admin_url: str, dbname: str) -> None:
    """Drops `dbname`, ignoring errors (used at exit)."""
    with contextlib.suppress(psycopg.Error), \
            psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(dbname)))


def keep_history(url: str, days: int) -> str:
    """Makes the queue tables' daily partitions for the `days` before today (empty), as a
    running installation has them under its retention, besides today's and those ahead
    that migrate made; says how many deliveries partitions there are."""
    with connect(url) as conn:
        if days > 0:
            conn.execute("SELECT webhooks.ensure_partitions(now() - make_interval(days => %s),"
                         " now())", (days,))
        row = conn.execute("SELECT count(*) FROM webhooks.queue_partitions"
                           " WHERE parent = 'deliveries'").fetchone()
    count = row[0] if row else 0
    return (f"{count} daily partitions per queue table ({days} days before today, today, "
            "the days ahead)")


def connect(url: str) -> psycopg.Connection[Any]:
    """An autocommit connection to the bench database; no statement runs over 5 minutes."""
    return psycopg.connect(url, autocommit=True, options="-c statement_timeout=300000")


def reset_service_state(conn: psycopg.Connection[Any]) -> None:
    """Empties the queue and the subscriptions, so one scenario never sees another's rows."""
    conn.execute("TRUNCATE webhooks.outbox, webhooks.attempts, webhooks.deliveries, "
                 "webhooks.events, webhooks.subscriptions RESTART IDENTITY CASCADE")


def create_table(conn: psycopg.Connection[Any], table: str, *, attach: str | None = None,
                 pad: int = 0) -> None:
    """(Re)creates public.<table> (id, a, b, t, pad); attaches it as resource `attach`.

    `pad` is the length of the text column `pad` default, so deliveries carry bodies of a
    realistic size (about 600 bytes with pad=400) without the writer sending it.
    """
    ident = sql.Identifier(table)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(ident))
    conn.execute(sql.SQL(
        "CREATE TABLE {} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, a integer, "
        "b text, t double precision, pad text DEFAULT {})").format(ident, sql.Literal("x" * pad)))
    if attach is not None:
        conn.execute("SELECT webhooks.attach(%s::regclass, resource => %s, noun => %s)",
                     (f"public.{table}", attach, attach.rstrip("s") or attach))


def subscribe(conn: psycopg.Connection[Any], resource: str, targets: Sequence[str], *,
              owner: str = "bench", events: Sequence[str] | None = None) -> list[int]:
    """Inserts one active subscription per target directly (no handshake); returns ids."""
    noun = resource.rstrip("s") or resource
    names = list(events or [f"{noun}.create", f"{noun}.update", f"{noun}.delete"])
    return [subscriptions.subscribe(conn, target, events=names, resource=resource,
                                    owner=owner)[0] for target in targets]


def insert_rows(conn: psycopg.Connection[Any], table: str, n: int) -> float:
    """Inserts `n` rows in one statement (one transaction); returns the wall-clock time
    right after the commit."""
    conn.execute(sql.SQL("INSERT INTO {} (a, b) SELECT g, 'x' FROM generate_series(1, %s) g")
                 .format(sql.Identifier(table)), (n,))
    return time.time()


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Polls `predicate` until it holds or `timeout` seconds pass; returns whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@dataclass
class Proc:
    """A subprocess started in its own process group, with its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    # py-spy writes its profile on SIGINT only; the service stops on either signal.
    stop_signal: signal.Signals = signal.SIGTERM

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        return self.popen.pid

    def main_pid(self) -> int:
        """The pid of the program itself: py-spy's child when profiled, else `pid`."""
        if self.stop_signal != signal.SIGINT:
            return self.pid
        try:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            return self.pid
        return int(children[0]) if children else self.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.popen.poll() is None

    def tail(self, lines: int = 5) -> str:
        """The last lines of its output, for error messages."""
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])


@dataclass
class Procs:
    """Every subprocess of the run; stop_all() at the end leaves none behind."""

    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench-")))
    running: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
              stdout_pipe: bool = False, profile: Path | None = None) -> Proc:
        """Starts `argv` in a new session (so its whole group can be signalled); with
        `profile`, under `py-spy record` writing collapsed stacks there."""
        log = self.workdir / f"{name}-{len(self.running)}.log"
        if profile is not None:
            profile.parent.mkdir(parents=True, exist_ok=True)
            spy = Path(PYTHON).parent / "py-spy"
            argv = [str(spy), "record", "--format", "raw", "--nolineno", "-r", "100",
                    "-o", str(profile), "--", *argv]
        out = log.open("wb")
        try:
            popen = subprocess.Popen(
                list(argv), env={**os.environ, **(env or {})}, cwd=ROOT,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if stdout_pipe else out,
                stderr=out, start_new_session=True)
        finally:
            out.close()
        proc = Proc(name, popen, log)
        if profile is not None:
            proc.stop_signal = signal.SIGINT
        self.running.append(proc)
        return proc

    def stop(self, proc: Proc, grace: float = 5.0) -> int | None:
        """SIGTERM to the group, then SIGKILL after `grace` seconds; returns the exit code."""
        if proc.alive():
            _signal_group(proc.pid, proc.stop_signal)
            try:
                proc.popen.wait(grace + (10 if proc.stop_signal == signal.SIGINT else 0))
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(5)
        # Children of the group (if any) must not outlive their leader.
        _signal_group(proc.pid, signal.SIGKILL)
        if proc.popen.stdout is not None:
            proc.popen.stdout.close()
        if proc in self.running:
            self.running.remove(proc)
        return proc.popen.returncode

    def stop_all(self) -> None:
        """Stops every process still running, newest first."""
        for proc in reversed(list(self.running)):
            self.stop(proc, grace=3.0)

    @contextlib.contextmanager
    def running_proc(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None,
                     profile: Path | None = None) -> Iterator[Proc]:
        """A started process, stopped when the block ends."""
        proc = self.start(name, argv, env, profile=profile)
        try:
            yield proc
        finally:
            self.stop(proc)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def peak_rss_mb(pid: int) -> float | None:
    """The peak resident set (VmHWM) of a live process, in MB; None when unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    try:
        import psutil  # only where /proc is missing; not a dependency of the service
    except ImportError:
        return None
    with contextlib.suppress(Exception):
        return float(psutil.Process(pid).memory_info().rss) / 2**20
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a live process has used so far; None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_queue_seconds(pid: int) -> float | None:
    """Seconds a live process's threads have spent runnable but waiting for a CPU so far
    (the second field of /proc/PID/task/*/schedstat); None when unknown. A thread that
    ended meanwhile takes its part with it."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    waited, seen = 0, False
    for task in tasks:
        try:
            waited += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[1])
            seen = True
        except (OSError, IndexError, ValueError):
            continue
    return waited / 1e9 if seen else None


def cpu_ticks() -> tuple[int, int] | None:
    """(idle and iowait, all) clock ticks of the machine's CPUs so far, from /proc/stat;
    None when unknown."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is counted in user)
    return fields[3] + fields[4], sum(fields[:8])


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; values need not be sorted."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100.0 * len(ordered))))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
