"""The bench's CPU accounting (bench/common.py): how long a process waited for a CPU, and
how idle the machine's CPUs were, read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.common import cpu_ticks, run_queue_seconds

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir()
                                or not hasattr(os, "sched_setaffinity"),
                                reason="reads Linux's /proc")

SPIN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"


def test_processes_sharing_one_cpu_wait_for_it_in_turn() -> None:
    cpu = min(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()\n" + SPIN],
                              stdin=subprocess.PIPE) for _ in range(3)]
    try:
        for p in procs:
            os.sched_setaffinity(p.pid, {cpu})
        before = []
        for p in procs:
            b = run_queue_seconds(p.pid)
            assert b is not None
            before.append(b)
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()  # all start spinning, on the same CPU
        waited = []
        for p, b in zip(procs, before, strict=True):
            # Read while the process lives (a zombie's threads are gone from /proc).
            while p.poll() is None:
                now = run_queue_seconds(p.pid)
                if now is not None:
                    waited.append(now - b)
                time.sleep(0.01)
        # Each needs 0.4 s of CPU on a CPU two others want too: the last to finish
        # waited about 0.8 s, twice what it ran (so it is the wait that is read, not
        # the run time beside it in schedstat).
        assert max(waited) > 0.55
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_process_that_is_gone_has_no_wait() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert run_queue_seconds(p.pid) is None


def test_cpu_ticks_count_up_and_idle_is_part_of_all() -> None:
    first = cpu_ticks()
    assert first is not None
    subprocess.run([sys.executable, "-c", SPIN], check=True)
    second = cpu_ticks()
    assert second is not None
    assert 0 <= first[0] <= first[1] and 0 <= second[0] <= second[1]
    assert second[1] > first[1]
