"""Scenario 1, capture cost: what the capture triggers cost the application's writes.

pgbench with 2 clients inserts into three tables of the same shape: one unattached (the
limit), one attached with an active subscription, one attached that nobody subscribes
to; single-row INSERTs with synchronous_commit on and off, and 100-row INSERT ... SELECT
statements; single-row UPDATEs with synchronous_commit off (an update pairs each new
row with its old one, for event.changed); and, as an info row, single-row INSERTs while
a worker waits (the triggers NOTIFY only then, see webhooks.wakeups). Runs are
interleaved and repeated (the median counts) because one run on a shared 2-core machine
is noisy; the tables and the outbox are emptied before every run so that their growth
does not favour whichever configuration runs first.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from psycopg import sql

from bench.common import (
    Result,
    connect,
    create_table,
    info_result,
    median,
    ratio_result,
    subscribe,
)
from bench.context import Context

PLAIN, SUBSCRIBED, NOBODY = "cap_plain", "cap_sub", "cap_nosub"
_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)


@dataclass(frozen=True)
class Config:
    """One pgbench configuration: which table, rows per statement, synchronous_commit."""

    key: str
    table: str
    rows: int
    sync: bool
    waiting: bool = False  # a row in webhooks.wakeups: a worker waits, commits NOTIFY
    update: bool = False  # single-row UPDATEs of UPDATE_ROWS rows instead of INSERTs


CONFIGS = [
    Config("plain", PLAIN, 1, True),
    Config("attached", SUBSCRIBED, 1, True),
    Config("nobody", NOBODY, 1, True),
    Config("plain_off", PLAIN, 1, False),
    Config("attached_off", SUBSCRIBED, 1, False),
    Config("attached_off_wait", SUBSCRIBED, 1, False, waiting=True),
    Config("plain_100", PLAIN, 100, True),
    Config("attached_100", SUBSCRIBED, 100, True),
    Config("plain_update", PLAIN, 1, False, update=True),
    Config("attached_update", SUBSCRIBED, 1, False, update=True),
]
# The rows the UPDATE configurations change, one at random per statement.
UPDATE_ROWS = 1000


def pgbench_args(url: str) -> tuple[list[str], dict[str, str]]:
    """pgbench's connection options and environment for a libpq URI."""
    parts = urlsplit(url)
    args = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432)]
    if parts.username:
        args += ["-U", unquote(parts.username)]
    env = {"PGPASSWORD": unquote(parts.password)} if parts.password else {}
    args.append(unquote(parts.path.lstrip("/")))
    return args, env


def _script(workdir: Path, config: Config) -> Path:
    path = workdir / f"capture-{config.key}.sql"
    # Table names are fixed identifiers of this module; pgbench takes a plain file.
    if config.update:
        text = (f"\\set id random(1, {UPDATE_ROWS})\n"
                f"UPDATE {config.table} SET a = a + 1 WHERE id = :id;\n")
    elif config.rows == 1:
        text = f"INSERT INTO {config.table} (a, b) VALUES (1, 'x');\n"
    else:
        text = (f"INSERT INTO {config.table} (a, b) "
                f"SELECT g, 'x' FROM generate_series(1, {config.rows}) g;\n")
    path.write_text(text)
    return path


def run_pgbench(ctx: Context, config: Config, seconds: int, script: Path) -> float:
    """Rows/s of one pgbench run of `config` (2 clients, 2 threads)."""
    args, env = pgbench_args(ctx.url)
    env = {**os.environ, **env}
    env["PGOPTIONS"] = "-c synchronous_commit=" + ("on" if config.sync else "off")
    argv = ["pgbench", "-n", "-c", "2", "-j", "2", "-T", str(seconds), "-f", str(script),
            *args]
    out = subprocess.run(argv, capture_output=True, text=True, env=env,
                         timeout=seconds + 60, start_new_session=True)
    match = _TPS.search(out.stdout)
    if out.returncode != 0 or not match:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"pgbench failed: {tail}")
    return float(match.group(1)) * config.rows


def _prepare(conn: Any, ctx: Context) -> None:
    create_table(conn, PLAIN)
    create_table(conn, SUBSCRIBED, attach=SUBSCRIBED)
    create_table(conn, NOBODY, attach=NOBODY)
    # The target is never contacted: no worker runs during this scenario.
    subscribe(conn, SUBSCRIBED, [ctx.target("capture")])


def _empty(conn: Any, table: str, rows: int = 0) -> None:
    conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(sql.Identifier(table)))
    if rows:
        conn.execute(sql.SQL("INSERT INTO {} (a, b) SELECT g, 'x' FROM generate_series(1, %s) g")
                     .format(sql.Identifier(table)), (rows,))
    conn.execute("TRUNCATE webhooks.outbox")
    conn.execute("CHECKPOINT")


def _set_waiting(conn: Any, waiting: bool) -> None:
    # The triggers NOTIFY only while a worker waits (a row in webhooks.wakeups); no worker
    # runs here, so a row stands in for one that waits and is never woken.
    conn.execute("DELETE FROM webhooks.wakeups")
    if waiting:
        conn.execute("INSERT INTO webhooks.wakeups (pid) VALUES (0)")


def _check_captured(conn: Any) -> None:
    # A subscription that matched nothing would make "attached" measure the skip path.
    row = conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone()
    if not row or row[0] == 0:
        raise RuntimeError("the attached table wrote no outbox rows: capture did not fire")


def scenario(ctx: Context) -> list[Result]:
    """Capture cost ratios: attached/plain rows/s, the median of interleaved runs."""
    if shutil.which("pgbench") is None:
        raise RuntimeError("pgbench is not installed (Debian: postgresql-contrib or "
                           "postgresql-client)")
    # Many short interleaved rounds beat a few long ones: the machine's load drifts.
    rounds, seconds = (4, 1) if ctx.quick else (5, 3)
    runs: dict[str, list[float]] = {c.key: [] for c in CONFIGS}
    with connect(ctx.url) as conn:
        _prepare(conn, ctx)
        row = conn.execute("SELECT to_regclass('webhooks.wakeups') IS NOT NULL").fetchone()
        has_wakeups = bool(row and row[0])
        configs = [c for c in CONFIGS if has_wakeups or not c.waiting]
        scripts = {c.key: _script(ctx.procs.workdir, c) for c in configs}
        for r in range(rounds):
            # Alternate the order, so neither side always runs on a warmer cache.
            for config in configs if r % 2 == 0 else reversed(configs):
                _empty(conn, config.table, UPDATE_ROWS if config.update else 0)
                if has_wakeups:
                    _set_waiting(conn, config.waiting)
                runs[config.key].append(run_pgbench(ctx, config, seconds, scripts[config.key]))
                if config.table == SUBSCRIBED:
                    _check_captured(conn)
        for table in (PLAIN, SUBSCRIBED, NOBODY):
            _empty(conn, table)
        if has_wakeups:
            _set_waiting(conn, False)
    m = {k: median(v) for k, v in runs.items() if v}

    def spread(*keys: str) -> str:
        parts = [f"{k} " + "/".join(f"{x:,.0f}" for x in runs[k]) for k in keys]
        return (f"medians of {rounds}x{seconds}s, 2 clients; ratio = median of the rounds' "
                "ratios; runs: " + "; ".join(parts))

    def paired(service: str, limit: str) -> float:
        # Each round's two runs are close in time, so their ratio shares the load of the
        # moment; the median of those ratios is steadier than the ratio of the medians.
        return median([a / b for a, b in zip(runs[service], runs[limit], strict=True) if b])

    return [
        ratio_result("capture: 1-row INSERT, sync commit on", m["attached"], m["plain"],
                     "rows/s", 0.85, spread("attached", "plain"), paired("attached", "plain")),
        ratio_result("capture: 1-row INSERT, sync commit off", m["attached_off"],
                     m["plain_off"], "rows/s", 0.65, spread("attached_off", "plain_off"),
                     paired("attached_off", "plain_off")),
        *([info_result("capture: 1-row, sync off, a worker waiting (NOTIFY)",
                       m["attached_off_wait"], m["plain_off"], "rows/s",
                       "every commit NOTIFYs, as while a worker sleeps; "
                       + spread("attached_off_wait", "plain_off"))]
          if "attached_off_wait" in m else []),
        ratio_result("capture: 100-row INSERT", m["attached_100"], m["plain_100"], "rows/s",
                     0.5, spread("attached_100", "plain_100"), paired("attached_100", "plain_100")),
        ratio_result("capture: attached, nobody subscribes", m["nobody"], m["plain"],
                     "rows/s", 0.95, spread("nobody", "plain"), paired("nobody", "plain")),
        # An update pairs each new row with its old one for event.changed (issue 15).
        ratio_result("capture: 1-row UPDATE, sync commit off", m["attached_update"],
                     m["plain_update"], "rows/s", 0.65,
                     spread("attached_update", "plain_update"),
                     paired("attached_update", "plain_update")),
    ]
