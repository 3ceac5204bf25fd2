"""The benchmark report keeps the previous run beside the new (bench/run.py merge and
bench/report.py), without running a benchmark."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.common import Result, error_result
from bench.report import markdown_table, previous_cells, previous_runs
from bench.run import from_json, merge

RUN1 = "2026-01-01 10:00 UTC, make bench"
RUN2 = "2026-01-02 10:00 UTC, python -m bench.run --only throughput"


def result(name: str, service: float, limit: float = 100.0) -> Result:
    return Result(name, service, limit, "req/s", "ratio ≥ 0.6", service / limit >= 0.6,
                  service / limit, "notes")


def by_name(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in entries}


def test_a_first_run_has_no_previous_figures() -> None:
    entries = merge([], ["throughput"], [("throughput", result("thr", 50.0))], run=RUN1)
    (entry,) = entries
    assert entry["previous"] is None and entry["run"] == RUN1
    table = markdown_table([from_json(e) for e in entries], [e["previous"] for e in entries])
    assert table.splitlines()[2].split(" | ")[7:9] == ["-", "-"]
    assert previous_runs([None]) == []


def test_a_full_run_keeps_each_row_of_the_last_beside_it() -> None:
    first = merge([], ["throughput", "backlog"],
                  [("throughput", result("thr", 50.0)), ("backlog", result("drain", 40.0))],
                  run=RUN1)
    second = by_name(merge(first, ["throughput", "backlog"],
                           [("throughput", result("thr", 70.0)),
                            ("backlog", result("drain", 45.0))], run=RUN2))
    assert second["thr"]["service"] == 70.0
    assert second["thr"]["previous"] == {"service": 50.0, "limit": 100.0, "ratio": 0.5,
                                         "met": False, "run": RUN1}
    assert second["drain"]["previous"]["service"] == 40.0
    assert previous_cells(second["thr"]["previous"], "req/s") == ("50.0", "0.500")


def test_an_only_run_leaves_the_other_rows_and_their_previous_alone() -> None:
    first = merge([], ["throughput", "backlog"],
                  [("throughput", result("thr", 50.0)), ("backlog", result("drain", 40.0))],
                  run=RUN1)
    second = merge(first, ["throughput", "backlog"],
                   [("throughput", result("thr", 60.0)), ("backlog", result("drain", 42.0))],
                   run=RUN1)
    third = by_name(merge(second, ["throughput"], [("throughput", result("thr", 80.0))],
                          run=RUN2))
    # The row not run is the second run's, with the first run as its previous: not
    # compared with itself.
    assert third["drain"]["service"] == 42.0 and third["drain"]["previous"]["service"] == 40.0
    assert third["thr"]["service"] == 80.0 and third["thr"]["previous"]["service"] == 60.0
    assert [e["scenario"] for e in merge(second, ["throughput"],
                                         [("throughput", result("thr", 1.0))])] == [
        "throughput", "backlog"]  # the suite's order, whatever ran


def test_results_of_the_old_format_are_read_as_previous() -> None:
    old = [{"scenario": "throughput", "name": "thr", "service": 30.0, "limit": 100.0,
            "ratio": 0.3, "unit": "req/s", "target": "ratio ≥ 0.6", "met": False,
            "notes": ""}]
    (entry,) = merge(old, ["throughput"], [("throughput", result("thr", 65.0))], run=RUN2)
    assert entry["previous"] == {"service": 30.0, "limit": 100.0, "ratio": 0.3,
                                 "met": False, "run": ""}
    assert previous_runs([entry["previous"]]) == []


def test_an_errored_row_is_shown_as_such_on_both_sides() -> None:
    first = merge([], ["api"], [("api", error_result("api", RuntimeError("boom")))],
                  run=RUN1)
    assert first[0]["error"] and first[0]["previous"] is None
    (entry,) = merge(first, ["api"], [("api", error_result("api", RuntimeError("again")))],
                     run=RUN2)
    assert previous_cells(entry["previous"], "") == ("error", "-")
    assert previous_runs([entry["previous"]]) == [RUN1]
    rows = markdown_table([from_json(entry)], [entry["previous"]]).splitlines()
    assert "again" in rows[2] and "error" in rows[2]


def test_each_run_is_kept_in_the_history_as_data(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "HISTORY", tmp_path / "history")
    when = datetime(2026, 1, 2, 10, 5, tzinfo=UTC)
    entries = merge([], ["throughput"], [("throughput", result("thr", 50.0))], run=RUN2)
    path = report.write_history(entries, {"cpu": "2 cores"}, RUN2, when,
                                "python -m bench.run --only throughput")
    assert path.name == "2026-01-02-1005-only-throughput.json"
    assert report.history_name(when, "make bench") == "2026-01-02-1005-make-bench.json"
    assert json.loads(path.read_text()) == {
        "run": RUN2, "title": "python -m bench.run --only throughput",
        "machine": "cpu: 2 cores", "rows": entries}
    # Every kept run reads alike: the rows of results.json, with when and where it ran.
    for kept in (Path(report.__file__).parent / "history").glob("*.json"):
        doc = json.loads(kept.read_text())
        assert {"run", "title", "machine"} <= doc.keys() and ("rows" in doc or "tables" in doc)
