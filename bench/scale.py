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

from pathlib import Path

from psycopg import sql

from bench.capture import Config, run_pgbench
from bench.common import Result, connect, create_table, median, ratio_result
from bench.context import Context
from tests.support.subscriptions import subscribe_many

CROWDED, EMPTY = "scale_crowded", "scale_empty"
ROWS = 1000


def _script(workdir: Path, table: str) -> Path:
    path = workdir / f"scale-{table}.sql"
    # Table names are fixed identifiers of this module; pgbench takes a plain file.
    path.write_text(f"\\set id random(1, {ROWS})\n"
                    f"UPDATE {table} SET a = a + 1 WHERE id = :id;\n")
    return path


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
        subscribe_many(conn, subscriptions, resource=CROWDED,
                       events=[f"{CROWDED.rstrip('s')}.create"], owners=1000, owner="owner",
                       tenant="tenant", secret="whsec_bench")
        conn.execute("ANALYZE webhooks.subscription_events")
        conn.execute("TRUNCATE webhooks.outbox")
        scripts = {t: _script(ctx.procs.workdir, t) for t in (CROWDED, EMPTY)}
        runs: dict[str, list[float]] = {CROWDED: [], EMPTY: []}
        for r in range(rounds):
            for table in (CROWDED, EMPTY) if r % 2 == 0 else (EMPTY, CROWDED):
                runs[table].append(run_pgbench(ctx, Config(table, table, 1, False), seconds,
                                               scripts[table]))
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
