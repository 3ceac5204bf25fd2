"""The outputs of a run: the printed table, bench/results.json, its copy in bench/history/
and bench/README.md."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.common import Result

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
HISTORY = HERE / "history"
README = HERE / "README.md"
HEADERS = ("scenario", "service", "limit", "ratio", "unit", "target", "result")
PREVIOUS = ("previous", "previous ratio")


def _num(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("ms", "s") or abs(value) < 100:
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    # Three decimals: 0.848 must not print as 0.85 next to a "ratio ≥ 0.85 MISS".
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def rows(results: Sequence[Result]) -> list[tuple[str, ...]]:
    """The table's cells, one tuple per result."""
    out: list[tuple[str, ...]] = []
    for r in results:
        if r.error:
            out.append((r.name, "error: " + r.error, "", "", "", "", "error"))
            continue
        verdict = "info" if r.target == "info" else {True: "pass", False: "MISS",
                                                     None: "-"}[r.met]
        out.append((r.name, _num(r.service, r.unit), _num(r.limit, r.unit),
                    _ratio(r.ratio), r.unit, r.target, verdict))
    return out


def text_table(results: Sequence[Result]) -> str:
    """The table printed at the end of a run (long error texts are not truncated)."""
    body = rows(results)
    widths = [max([len(h), *(len(row[i]) for row in body if row[6] != "error" or i == 0)])
              for i, h in enumerate(HEADERS)]
    widths[1] = max(widths[1], 8)

    def line(cells: Sequence[str]) -> str:
        if cells[6] == "error":
            return f"{cells[0]:<{widths[0]}}  {cells[1]}"
        return "  ".join(c.ljust(w) if i in (0, 4, 5, 6) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    sep = "  ".join("-" * w for w in widths)
    return "\n".join(x.rstrip() for x in [line(HEADERS), sep, *(line(r) for r in body)])


def previous_cells(previous: dict[str, Any] | None, unit: str) -> tuple[str, str]:
    """The previous run's (service, ratio) cells of a row: "-" when there was none."""
    if not previous:
        return "-", "-"
    if previous.get("error"):
        return "error", "-"
    return _num(previous.get("service"), unit), _ratio(previous.get("ratio"))


def markdown_table(results: Sequence[Result],
                   previous: Sequence[dict[str, Any] | None] | None = None) -> str:
    """The table as GitHub markdown: each row's figures, the previous run's service figure
    and ratio beside them, and the notes as a last column."""
    before = list(previous) if previous is not None else [None] * len(results)
    lines = ["| " + " | ".join((*HEADERS, *PREVIOUS, "notes")) + " |",
             "|" + "---|" * (len(HEADERS) + len(PREVIOUS) + 1)]
    for r, cells, old in zip(results, rows(results), before, strict=True):
        notes = (r.notes or "").replace("|", "\\|")
        lines.append("| " + " | ".join((*(c.replace("|", "\\|") for c in cells),
                                        *previous_cells(old, r.unit), notes)) + " |")
    return "\n".join(lines)


def previous_runs(previous: Sequence[dict[str, Any] | None]) -> list[str]:
    """The runs the previous figures come from, oldest first, each once."""
    runs = {str(p.get("run")): None for p in previous if p and p.get("run")}
    return sorted(runs)


SERVER_SETTINGS = ("autovacuum", "fsync", "synchronous_commit", "shared_buffers", "max_wal_size")


def machine(url: str) -> dict[str, str]:
    """CPU model, cores, memory, PostgreSQL (its version, server and the settings in
    SERVER_SETTINGS), Python and tool versions of this run."""
    info: dict[str, str] = {"cpu": platform.processor() or platform.machine()}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
        if m:
            info["cpu"] = m.group(1).strip()
    except OSError:
        pass
    info["cores"] = str(os.cpu_count() or "?")
    try:
        meminfo = Path("/proc/meminfo").read_text()
        m = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.MULTILINE)
        if m:
            info["memory"] = f"{int(m.group(1)) / 2**20:.1f} GiB"
    except OSError:
        pass
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            info["postgresql"] = str(row[0]) if row else "?"
            # The server's settings that move the queue's figures: a server shared with a
            # CI may run without autovacuum (the outbox and queue then keep their dead
            # rows between the worker's own maintenance) or on another disk setting.
            rows = conn.execute(
                "SELECT name, current_setting(name) FROM pg_catalog.pg_settings"
                " WHERE name = ANY (%s) ORDER BY name", (list(SERVER_SETTINGS),)).fetchall()
            info["postgresql settings"] = ", ".join(f"{n} {v}" for n, v in rows)
            info["postgresql server"] = f"{conn.info.host}:{conn.info.port}"
    except psycopg.Error as exc:
        info["postgresql"] = f"unknown ({exc.__class__.__name__})"
    info["python"] = platform.python_version()
    info["os"] = platform.platform()
    if shutil.which("wrk"):
        out = subprocess.run(["wrk", "--version"], capture_output=True, text=True, timeout=5)
        info["wrk"] = (out.stdout or out.stderr).split("[")[0].strip() or "installed"
    else:
        info["wrk"] = "not installed (Python load generator used)"
    return info


def load_previous() -> list[dict[str, Any]]:
    """The results.json of the last run (empty when missing or unreadable)."""
    try:
        data = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def write_results(entries: list[dict[str, Any]]) -> None:
    """Writes bench/results.json."""
    RESULTS.write_text(json.dumps(entries, indent=2, ensure_ascii=False) + "\n")


def history_name(when: datetime, command: str) -> str:
    """The file of a run in bench/history/: its date and minute (UTC), then what ran, so
    that the names sort oldest first."""
    what = re.sub(r"[^a-z0-9]+", "-", command.removeprefix("python -m bench.run").lower())
    return f"{when:%Y-%m-%d-%H%M}-{what.strip('-')[:60] or 'run'}.json"


def write_history(entries: list[dict[str, Any]], info: dict[str, str], run: str,
                  when: datetime, command: str) -> Path:
    """Writes the run's results.json (its rows, each with the run it comes from) into
    bench/history/, with when and how it ran and the machine: the dated history is kept
    as data, one file per run."""
    HISTORY.mkdir(exist_ok=True)
    path = HISTORY / history_name(when, command)
    doc = {"run": run, "title": command,
           "machine": "; ".join(f"{k}: {v}" for k, v in info.items()), "rows": entries}
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    return path


def write_readme(results: Sequence[Result], info: dict[str, str], command: str,
                 when: str, quick: bool,
                 previous: Sequence[dict[str, Any] | None] | None = None) -> None:
    """Writes bench/README.md: what is measured, the table (with the previous run's
    figures beside the new), the machine, how to reproduce."""
    intro = (HERE / "README.intro.md").read_text().strip()
    kind = "quick run (`--quick`: shorter runs, smaller counts)" if quick else "full run"
    machine_lines = "\n".join(f"- {k}: {v}" for k, v in info.items())
    runs = previous_runs(previous or [])
    if runs:
        before = ("The previous figures (columns previous and previous ratio) come from: "
                  + "; ".join(f"`{r}`" for r in runs) + ".")
    elif any(previous or []):
        before = ("The previous figures (columns previous and previous ratio) come from the "
                  "run recorded before this one.")
    else:
        before = "No previous figures: this is the first run recorded here."
    README.write_text(f"""{intro}

## Latest results

{kind}, {when}, command: `{command}`

{before}

{markdown_table(results, previous)}

## Machine

{machine_lines}

The API scenario and the receiver share the machine's cores with PostgreSQL and the
load generators, as on a small production host; figures from a loaded machine (other
processes running) understate the service and its limits alike, which is why every
target is a ratio to a limit measured in the same run, or an absolute bound.

## Reproduce

```sh
make bench          # the whole suite, a few minutes
make bench-quick    # under two minutes
.venv/bin/python -m service.commands.devdb exec -- \
  .venv/bin/python -m bench.run --only capture,latency
# profiles (py-spy in .venv): workers and the API run under py-spy
.venv/bin/python -m service.commands.devdb exec -- \
  .venv/bin/python -m bench.run --profile bench/out
.venv/bin/python -m bench.profile bench/out/*.txt
```

`--only` runs some scenarios and keeps the other rows of `results.json` from the last
run. `--history-days 0` leaves out the seven past days of partitions (a new
installation's database). `BENCH_DEBUG=1` prints a scenario's traceback and keeps the
processes' logs.

Findings and profiles: [FINDINGS.md](FINDINGS.md).
""")
