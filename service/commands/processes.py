"""`webhooks worker --processes N` and `webhooks api --processes N`: N processes on one
host, kept running.

One Python process uses one core at most (its event loop, the JSON and signing work). N
worker processes share the database like workers on N hosts (SKIP LOCKED claims, one
fan-out at a time), so this is the same as starting N `webhooks worker` commands, with one
command to stop them; N API processes bind one port with SO_REUSEPORT and the kernel
spreads the connections between them. The parent starts the children, restarts one that
exits on its own (with a backoff), and on SIGTERM or SIGINT sends them SIGTERM and waits
for each to finish its in-flight work. A child also gets SIGTERM if the parent dies.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

log = logging.getLogger("webhooks.processes")

RESTART_MIN, RESTART_MAX = 1.0, 30.0
# A child up for this long had a fresh failure when it exits: its backoff starts over.
HEALTHY_AFTER = 60.0


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the parent exits, so an abruptly
    killed parent leaves no worker behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class Child:
    """One child process and its restart state."""

    number: int
    argv: list[str]
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff: float = RESTART_MIN
    restart_at: float | None = None

    def start(self) -> None:
        self.popen = subprocess.Popen(self.argv, preexec_fn=_die_with_parent,
                                      start_new_session=True)
        self.started = time.monotonic()
        self.restart_at = None
        log.info("process %d started (pid %d)", self.number, self.popen.pid)


def child_argv(number: int, concurrency: int | None, metrics_port: int | None,
               metrics_host: str) -> list[str]:
    """The command line of child `number` (0-based): one worker process, its metrics (if
    any) on its own port, metrics_port + number."""
    argv = [sys.executable, "-m", "service", "worker", "--processes", "1"]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port + number), "--metrics-host", metrics_host]
    return argv


def api_child_argv(host: str, port: int) -> list[str]:
    """The command line of one API process of `webhooks api --processes N`: all bind
    host:port with SO_REUSEPORT."""
    return [sys.executable, "-m", "service", "api", "--processes", "1", "--reuse-port",
            "--host", host, "--port", str(port)]


def run_processes(argvs: Sequence[list[str]], *, poll: float = 0.2) -> int:
    """Runs one child per command line until SIGTERM/SIGINT; returns the exit status (0
    when every child stopped cleanly)."""
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if not stopping:
            log.info("received %s, stopping %d processes", signal.Signals(signum).name,
                     len(children))
        stopping = True

    children = [Child(i, list(argv)) for i, argv in enumerate(argvs)]
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for child in children:
            child.start()
        while not stopping:
            _supervise(children)
            time.sleep(poll)
        status = 0
        for child in children:
            if child.popen is not None and child.popen.poll() is None:
                child.popen.send_signal(signal.SIGTERM)
        for child in children:
            if child.popen is not None:
                code = child.popen.wait()
                if code not in (0, -signal.SIGTERM):
                    log.error("process %d exited with status %s", child.number, code)
                    status = 1
        return status
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _supervise(children: Sequence[Child]) -> None:
    """Restarts children that exited on their own, with a backoff per child."""
    now = time.monotonic()
    for child in children:
        if child.popen is None:
            continue
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.start()
            continue
        code = child.popen.poll()
        if code is None:
            continue
        if now - child.started > HEALTHY_AFTER:
            child.backoff = RESTART_MIN
        log.error("process %d exited with status %s; restarting in %.0fs",
                  child.number, code, child.backoff)
        child.restart_at = now + child.backoff
        child.backoff = min(child.backoff * 2, RESTART_MAX)
