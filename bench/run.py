"""`python -m bench.run [--quick] [--only NAME,...]`: the benchmark suite.

Creates a fresh database (webhooks_bench) on the server of DATABASE_URL, migrates it,
starts the receiver, runs the scenarios in order, prints one table and writes
bench/results.json, a copy of it in bench/history/ (named by the run's date) and
bench/README.md. A scenario that fails prints its error in its row and the suite goes
on; every process the run started is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench import (
    api,
    capture,
    delivery,
    https,
    load,
    noisy,
    ratelimit,
    report,
    resilience,
    scale,
    scale_queue,
    slow,
)
from bench.common import (
    BENCH_DB,
    Procs,
    Result,
    drop_database,
    error_result,
    keep_history,
    recreate_database,
)
from bench.context import Context

Scenario = Callable[[Context], list[Result]]
SCENARIOS: dict[str, Scenario] = {
    "capture": capture.scenario,
    "capture_scale": scale.scenario,
    "throughput": delivery.throughput,
    "latency": delivery.latency,
    "fanout": delivery.fanout,
    "backlog": resilience.backlog,
    "isolation": resilience.isolation,
    "burst_one": load.burst_one,
    "latency_load": load.latency_load,
    "workers_two": load.workers_two,
    "api": api.scenario,
    "fanout_scale": scale_queue.fanout_scale,
    "api_scale": scale_queue.api_scale,
    "retention": scale_queue.retention,
    "noisy_neighbour": noisy.scenario,
    "slow_targets": slow.scenario,
    "https": https.scenario,
    "rate_limit": ratelimit.scenario,
}
# slow_targets and https start receivers of their own.
NEEDS_RECEIVER = set(SCENARIOS) - {"capture", "capture_scale", "slow_targets", "https"}


# The default retention (WEBHOOKS_RETENTION, 7 days) keeps a partition per day before
# today in each queue table, and every queue statement reads each partition's indexes.
HISTORY_DAYS = 7


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="shorter runs and smaller counts (the whole suite in < 2 min)")
    parser.add_argument("--only", default="",
                        help="comma-separated scenarios: " + ",".join(SCENARIOS))
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="run workers and the API under py-spy; collapsed stacks go to "
                             "DIR/<scenario>-<process>.txt (summarise: python -m bench.profile)")
    parser.add_argument("--history-days", type=int, default=HISTORY_DAYS, metavar="N",
                        help="daily partitions of the queue tables made for the N days "
                             f"before today, as a running installation keeps them (default "
                             f"{HISTORY_DAYS}: the default WEBHOOKS_RETENTION); 0: a new "
                             "installation's (today and two ahead)")
    parser.add_argument("--keep-db", action="store_true",
                        help="keep the webhooks_bench database afterwards, for inspection")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from "
                     + ", ".join(SCENARIOS))
    args.names = names
    return args


def _terminate(signum: int, frame: FrameType | None) -> None:
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every child process.
    raise KeyboardInterrupt


def run_scenarios(ctx: Context, names: Sequence[str]) -> list[tuple[str, Result]]:
    """Runs each scenario, failing soft; returns (scenario, result) pairs in order."""
    out: list[tuple[str, Result]] = []
    for name in names:
        started = time.monotonic()
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        ctx.scenario = name
        try:
            if name in NEEDS_RECEIVER and ctx.receiver is None:
                ctx.start_receiver()
            results = SCENARIOS[name](ctx)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            if os.environ.get("BENCH_DEBUG"):
                traceback.print_exc()
            results = [error_result(name, exc)]
        finally:
            # A scenario leaves no worker or API behind, even when it failed.
            for proc in list(ctx.procs.running):
                if proc is not ctx.receiver:
                    ctx.procs.stop(proc)
        print(f"bench: {name} done in {time.monotonic() - started:.1f}s", file=sys.stderr,
              flush=True)
        out += [(name, r) for r in results]
    return out


def merge(previous: list[dict[str, Any]], ran: Sequence[str],
          new: Sequence[tuple[str, Result]], run: str = "") -> list[dict[str, Any]]:
    """results.json after a run: the rows of the scenarios run are new, each with `run`
    (when and how) and `previous` (its figures in the results it replaces, or None); the
    rows of the scenarios not run (an --only run) stay as they were, previous included."""
    before = {e.get("name"): e for e in previous if isinstance(e, dict)}
    fresh = [{"scenario": s, **r.as_json(), "run": run,
              "previous": _summary(before.get(r.name))} for s, r in new]
    kept = [e for e in previous if isinstance(e, dict) and e.get("scenario") not in ran]
    order = list(SCENARIOS)
    merged = kept + fresh
    merged.sort(key=lambda e: order.index(e["scenario"]) if e.get("scenario") in order
                else len(order))
    return merged


def _summary(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a row keeps of the one it replaces: its figures and its run."""
    if entry is None:
        return None
    if entry.get("error"):
        return {"error": entry["error"], "run": entry.get("run", "")}
    return {k: entry.get(k) for k in ("service", "limit", "ratio", "met")} | {
        "run": entry.get("run", "")}


def from_json(entry: dict[str, Any]) -> Result:
    """A Result back from a results.json entry."""
    return Result(name=str(entry.get("name", "")), service=entry.get("service"),
                  limit=entry.get("limit"), unit=str(entry.get("unit") or ""),
                  target=str(entry.get("target") or ""), met=entry.get("met"),
                  ratio=entry.get("ratio"), notes=str(entry.get("notes") or ""),
                  error=entry.get("error"))


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the suite; exit status 0 even when targets are missed (it is not a test)."""
    args = parse_args(argv)
    admin_url = os.environ.get("DATABASE_URL")
    if not admin_url:
        print("bench: DATABASE_URL is not set; run `make bench` (which starts a private "
              "cluster) or set it", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    load_before = os.getloadavg()
    procs = Procs()
    url = recreate_database(admin_url, BENCH_DB)
    try:
        from service.db import migrate

        migrate(url)
        history = keep_history(url, args.history_days)
        ctx = Context(url=url, quick=args.quick, procs=procs,
                      profile_dir=Path(args.profile).resolve() if args.profile else None)
        results = run_scenarios(ctx, args.names)
        info = report.machine(url)
        info["queue partitions"] = history
        # Other processes on the machine skew every figure: the load says how much.
        info["load average before/after (1 min)"] = (f"{load_before[0]:.2f} / "
                                                      f"{os.getloadavg()[0]:.2f}")
    finally:
        procs.stop_all()
        # Process logs stay only when asked for, to see why a scenario failed.
        if os.environ.get("BENCH_DEBUG"):
            print(f"bench: process logs in {procs.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(procs.workdir, ignore_errors=True)
        if not args.keep_db:
            drop_database(admin_url, BENCH_DB)

    table = report.text_table([r for _, r in results])
    print(table)
    command = "make bench-quick" if args.quick else "make bench"
    if len(args.names) < len(SCENARIOS):
        command = "python -m bench.run " + shlex.join(
            (["--quick"] if args.quick else []) + ["--only", ",".join(args.names)])
    now = datetime.now(UTC)
    when = now.strftime("%Y-%m-%d %H:%M UTC")
    entries = merge(report.load_previous(), args.names, results, run=f"{when}, {command}")
    report.write_results(entries)
    dated = report.write_history(entries, info, f"{when}, {command}", now, command)
    report.write_readme([from_json(e) for e in entries], info, command, when, args.quick,
                        previous=[e.get("previous") for e in entries])
    print(f"\nbench: {len(results)} rows in {time.monotonic() - started:.0f}s; wrote "
          f"bench/results.json, bench/history/{dated.name} and bench/README.md",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        # The finally blocks have stopped every process the run started.
        print("bench: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
