"""The short chaos run (`make chaos` runs a longer one): nothing committed is lost while
workers are killed, Postgres restarts and LISTEN connections are cut."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(300)
def test_short_chaos_run_loses_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "tests.chaos", "--short", "--seed", "7"],
                            capture_output=True, text=True, timeout=280)
    table = result.stdout
    assert "chaos: PASS" in table, table + result.stderr[-3000:]
    lost = next(line for line in table.splitlines() if line.strip().startswith("lost"))
    assert lost.split()[-1] == "0"
