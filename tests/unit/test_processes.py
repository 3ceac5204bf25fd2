"""`webhooks worker --processes N`: each child is one worker process, with its metrics on
a port of its own (service/commands/processes.py child_argv; the processes running,
restarted and stopped: tests/e2e/test_worker_processes.py)."""

from __future__ import annotations

from service.commands.processes import child_argv


def test_each_child_is_one_worker_with_its_own_metrics_port() -> None:
    argv = child_argv(2, 16, 9100, "0.0.0.0")
    assert argv[1:] == ["-m", "service", "worker", "--processes", "1", "--concurrency", "16",
                        "--metrics-port", "9102", "--metrics-host", "0.0.0.0"]
    assert "--metrics-port" not in child_argv(0, None, None, "127.0.0.1")
