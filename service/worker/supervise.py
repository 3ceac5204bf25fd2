"""Supervision of the worker's side tasks (listener, recorder, pruner) and its loop.

A task that crashes is noticed at once, not discovered at shutdown: the crash is logged at
ERROR with its traceback, counted in metrics, written to webhooks.worker_tasks (read by
`webhooks status`), and the task is restarted with exponential backoff and jitter.
"""

from __future__ import annotations

import asyncio
import logging
import random
import traceback
from collections.abc import Awaitable, Callable

from service.logs import redact
from service.store import Store
from service.worker.delivery import pg_text
from service.worker.metrics import WorkerMetrics

log = logging.getLogger("webhooks.worker")

# A crashed task is restarted after RESTART_MIN seconds, doubling (with jitter) up to
# RESTART_MAX while it keeps crashing; one that ran RESTART_RESET seconds since its last
# restart starts over from RESTART_MIN.
RESTART_MIN = 0.1
RESTART_MAX = 30.0
RESTART_RESET = 60.0
# Longest wait for writing a crash to webhooks.worker_tasks.
HEALTH_WRITE_TIMEOUT = 2.0


class Supervisor:
    """Runs the worker `name`'s tasks, restarting the ones that crash."""

    def __init__(self, store: Store, name: str, metrics: WorkerMetrics) -> None:
        self.store = store
        self.name = name
        self.metrics = metrics
        self.restarts: dict[str, int] = {}  # task -> restarts so far

    def start(self, task: str, run: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Starts `run()` supervised as `task`, in the running loop."""
        return asyncio.create_task(self.supervise(task, run), name=f"webhooks-{task}")

    async def supervise(self, task: str, run: Callable[[], Awaitable[None]]) -> None:
        """Runs `run()` until it returns, restarting it after a crash with exponential
        backoff and jitter. Cancellation stops it."""
        loop = asyncio.get_running_loop()
        backoff = RESTART_MIN
        while True:
            started = loop.time()
            try:
                await run()
                return
            except Exception as exc:
                if loop.time() - started >= RESTART_RESET:
                    backoff = RESTART_MIN  # it ran fine for a while: a fresh failure
                delay = await self.crashed(task, exc, backoff)
                await asyncio.sleep(delay)
                backoff = min(backoff * 2, RESTART_MAX)

    async def crashed(self, task: str, exc: BaseException, backoff: float) -> float:
        """Reports a crash of `task`; returns how long to wait before restarting it."""
        delay = backoff * random.uniform(0.5, 1.5)
        restarts = self.restarts[task] = self.restarts.get(task, 0) + 1
        self.metrics.task_restarts.labels(task).inc()
        log.error("worker task %s crashed (restart %d), restarting in %.2fs\n%s", task,
                  restarts, delay, "".join(traceback.format_exception(exc)).rstrip(),
                  exc_info=exc, extra={"task": task, "restarts": restarts})
        error = pg_text(redact(f"{type(exc).__name__}: {exc}"))
        try:
            async with asyncio.timeout(HEALTH_WRITE_TIMEOUT):
                await self.store.task_crashed(worker=self.name, task=task,
                                              restarts=restarts, error=error)
        except Exception as write_error:
            # The database may be what failed; the log line and the metric remain.
            log.warning("could not record the crash of task %s in webhooks.worker_tasks: %s",
                        task, write_error)
        return delay


async def cancel_all(tasks: list[asyncio.Task[None]], again_after: float = 1.0) -> None:
    """Cancels `tasks` and waits until every one has ended, cancelling those still running
    again every `again_after` seconds. A cancellation can be lost inside a library (on
    Python 3.11, asyncio.wait_for returns a result that came at the same moment as the
    cancellation, which the pool's waits use): the task's loop then goes on, and shutdown
    would wait for it forever."""
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=again_after)
