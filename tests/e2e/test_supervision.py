"""The worker's background tasks are supervised: a crash is logged with its traceback,
the task restarted with backoff, counted in metrics and shown by `webhooks status`."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client import generate_latest

from service.commands.status import collect, render
from service.worker import listener, pruning, recorder, supervise
from service.worker import loop as worker
from service.worker.loop import Worker, open_worker
from service.worker.metrics import TASKS
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, make_settings, metric, poll


@pytest.fixture
def health(conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
    yield conn


def crash_first(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, times: int,
                message: str) -> list[int]:
    """Makes `owner.name` (an async method) raise RuntimeError(message) on its first
    `times` calls, then behave as before; returns a one-item list counting the calls."""
    original = getattr(owner, name)
    calls = [0]

    async def flaky(self: object, *args: object, **kwargs: object) -> object:
        calls[0] += 1
        if calls[0] <= times:
            raise RuntimeError(f"{message} #{calls[0]}")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, flaky)
    return calls


def restarted(w: Worker) -> dict[str, int]:
    """The worker's tasks restarted so far, and how often (webhooks_worker_task_restarts)."""
    counts = {task: metric(w, "webhooks_worker_task_restarts_total", task=task)
              for task in TASKS}
    return {task: int(n) for task, n in counts.items() if n}


def restarts_metric(text: str, task: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'webhooks_worker_task_restarts_total{{task="{task}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return -1.0


async def test_crashed_tasks_are_restarted_counted_and_shown(
        db_url: str, health: psycopg.Connection, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    conn = health
    caplog.set_level(logging.ERROR, logger="webhooks.worker")
    monkeypatch.setattr(supervise, "RESTART_MIN", 0.05, raising=False)
    monkeypatch.setattr(pruning, "PRUNE_EVERY", 0.05)
    crash_first(monkeypatch, listener.Listener, "_listen_once", 2, "listener bug")
    crash_first(monkeypatch, recorder.Recorder, "_write", 1, "recorder bug")

    async def broken_prune(pool: object, retention: float) -> int:
        raise RuntimeError("pruner bug")

    monkeypatch.setattr(pruning, "prune", broken_prune)
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        async with open_worker(make_settings(db_url, poll_interval=30.0),
                               concurrency=4) as w:
            # The listener came back after two crashes, and deliveries flow.
            await poll(lambda: w.listener.connected.is_set(), what="listener restarted")
            add_invoice(conn, "SUP-1")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
            # The recorder crashed on that outcome's batch; restarted, it wrote it.
            await poll(lambda: conn.execute("SELECT status FROM webhooks.deliveries"
                                            ).fetchone() == ("succeeded",),
                       what="the outcome recorded by the restarted recorder")
            await poll(lambda: restarted(w).get("pruner", 0) >= 2,
                       what="the pruner restarted, with backoff")
            metrics = generate_latest(w.metrics.registry).decode()
            tasks = {r[0]: r[1:] for r in conn.execute(
                "SELECT task, restarts, last_error FROM webhooks.worker_tasks"
                " WHERE worker = %s", (w.name,)).fetchall()}
        assert restarted(w)["listener"] == 2 and restarted(w)["recorder"] == 1
    assert restarts_metric(metrics, "listener") == 2.0
    assert restarts_metric(metrics, "recorder") == 1.0
    assert restarts_metric(metrics, "pruner") >= 2.0
    assert restarts_metric(metrics, "loop") == 0.0
    assert tasks["listener"] == (2, "RuntimeError: listener bug #2")
    assert tasks["recorder"] == (1, "RuntimeError: recorder bug #1")
    assert tasks["pruner"][0] >= 2 and "pruner bug" in tasks["pruner"][1]
    crashes = [r for r in caplog.records if r.levelno == logging.ERROR
               and "crashed" in r.getMessage()]
    assert {getattr(r, "task", None) for r in crashes} == {"listener", "recorder", "pruner"}
    assert all("Traceback (most recent call last)" in r.getMessage() for r in crashes)
    text = render(collect(conn))
    assert "Worker tasks    crashed and restarted (last day)" in text
    assert "listener  2 restarts" in text and "RuntimeError: listener bug #2" in text


async def test_a_crash_in_the_claim_loop_does_not_stop_the_worker(
        db_url: str, health: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = health
    monkeypatch.setattr(supervise, "RESTART_MIN", 0.05, raising=False)
    crash_first(monkeypatch, worker.Worker, "_step", 3, "loop bug")
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        async with open_worker(make_settings(db_url), concurrency=4) as w:
            add_invoice(conn, "LOOP-1")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
            assert restarted(w) == {"loop": 3}
    row = conn.execute("SELECT restarts, last_error FROM webhooks.worker_tasks"
                       " WHERE task = 'loop'").fetchone()
    assert row == (3, "RuntimeError: loop bug #3")


async def test_the_worker_runs_without_the_health_table(
        db_url: str, conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    conn.execute("DROP TABLE IF EXISTS webhooks.worker_tasks")
    monkeypatch.setattr(supervise, "RESTART_MIN", 0.05, raising=False)
    crash_first(monkeypatch, listener.Listener, "_listen_once", 1, "listener bug")
    async with Receiver() as receiver:
        subscribe(conn, receiver.url)
        async with open_worker(make_settings(db_url), concurrency=4) as w:
            await poll(lambda: w.listener.connected.is_set(), what="listener restarted")
            add_invoice(conn, "NOTABLE")
            await receiver.wait_for(lambda r: len(r.deliveries()) == 1)
            assert restarted(w) == {"listener": 1}
