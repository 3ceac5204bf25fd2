"""The short chaos run (`make chaos` runs a longer one): nothing committed is lost while
workers are killed, Postgres restarts and LISTEN connections are cut."""

from __future__ import annotations

import subprocess
import sys

import pytest


# The run's own drain waits while deliveries keep arriving (at most 10 minutes, and gives up
# after 30 s without progress); the short run's drain takes seconds to a minute.
@pytest.mark.timeout(720)
def test_short_chaos_run_loses_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "tests.chaos", "--short", "--seed", "7"],
                            capture_output=True, text=True, timeout=700)
    table = result.stdout
    if "chaos: PASS" not in table:
        # The whole table (an assertion's message would be cut in the middle).
        pytest.fail(table + "\n" + result.stderr[-3000:], pytrace=False)
    lost = next(line for line in table.splitlines() if line.strip().startswith("lost"))
    assert lost.split()[-1] == "0"
