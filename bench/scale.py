"""Scenario: capture cost with many subscriptions (the capture probe at scale).

Two attached tables of the same shape; 100,000 active subscriptions (20,000 with --quick)
want `.create` events of the first, none want anything of the second. pgbench with 2
clients runs single-row UPDATEs (an event nobody subscribes to) on each, with
synchronous_commit off so that commits do not hide the trigger's work. The probe is one
index lookup in webhooks.subscription_events, so the ratio should be about 1 whatever
the number of subscriptions. Rounds are interleaved; the ratio is the median of the
rounds' paired ratios.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from psycopg import sql

from bench.capture import _TPS, pgbench_args
from bench.common import Result, connect, create_table, median, ratio_result
from bench.context import Context

CROWDED, EMPTY = "scale_crowded", "scale_empty"
ROWS = 1000


def _script(workdir: Path, table: str) -> Path:
    path = workdir / f"scale-{table}.sql"
    # Table names are fixed identifiers of this module; pgbench takes a plain file.
    path.write_text(f"\\set id random(1, {ROWS})\n"
                    f"UPDATE {table} SET a = a + 1 WHERE id = :id;\n")
    return path


def _run(ctx: Context, script: Path, seconds: int) -> float:
    args, env = pgbench_args(ctx.url)
    env = {**os.environ, **env, "PGOPTIONS": "-c synchronous_commit=off"}
    argv = ["pgbench", "-n", "-c", "2", "-j", "2", "-T", str(seconds), "-f", str(script),
            *args]
    out = subprocess.run(argv, capture_output=True, text=True, env=env,
                         timeout=seconds + 60, start_new_session=True)
    match = _TPS.search(out.stdout)
    if out.returncode != 0 or not match:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"pgbench failed: {tail}")
    return float(match.group(1))


def scenario(ctx: Context) -> list[Result]:
    """Capture with 100,000 subscriptions to other events vs. a table with none."""
    subscriptions = 20_000 if ctx.quick else 100_000
    rounds, seconds = (4, 1) if ctx.quick else (5, 3)
    with connect(ctx.url) as conn:
        for table in (CROWDED, EMPTY):
            create_table(conn, table, attach=table)
            conn.execute(sql.SQL("INSERT INTO {} (a, b) SELECT g, 'x' "
                                 "FROM generate_series(1, %s) g").format(sql.Identifier(table)),
                         (ROWS,))
        conn.execute(
            "INSERT INTO webhooks.subscriptions (owner, tenant, resource, events, target, secret)"
            " SELECT 'owner' || (i %% 1000), 'tenant' || i, %s, ARRAY[%s], "
            "'http://127.0.0.1:9/', 'whsec_bench' FROM generate_series(1, %s) AS i",
            (CROWDED, f"{CROWDED.rstrip('s')}.create", subscriptions))
        conn.execute("ANALYZE webhooks.subscription_events")
        conn.execute("TRUNCATE webhooks.outbox")
        scripts = {t: _script(ctx.procs.workdir, t) for t in (CROWDED, EMPTY)}
        runs: dict[str, list[float]] = {CROWDED: [], EMPTY: []}
        for r in range(rounds):
            for table in (CROWDED, EMPTY) if r % 2 == 0 else (EMPTY, CROWDED):
                runs[table].append(_run(ctx, scripts[table], seconds))
        row = conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone()
        if row and row[0]:
            raise RuntimeError("updates nobody subscribes to wrote outbox rows")
        conn.execute("DELETE FROM webhooks.subscriptions WHERE resource = %s", (CROWDED,))
        for table in (CROWDED, EMPTY):
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))
    ratio = median([a / b for a, b in zip(runs[CROWDED], runs[EMPTY], strict=True) if b])
    notes = (f"single-row UPDATEs, sync off, 2 clients; {subscriptions:,} subscriptions to "
             f"the crowded table's .create; medians of {rounds}x{seconds}s; runs: crowded "
             + "/".join(f"{x:,.0f}" for x in runs[CROWDED]) + "; empty "
             + "/".join(f"{x:,.0f}" for x in runs[EMPTY]))
    return [ratio_result(f"capture: {subscriptions:,} subscriptions to other events",
                         median(runs[CROWDED]), median(runs[EMPTY]), "statements/s", 0.95,
                         notes, ratio)]
