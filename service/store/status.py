"""What the service is doing (sql/queries/status.sql): `webhooks status`'s figures, and
the worker's queue gauges."""

from __future__ import annotations

import json
import re
from typing import Any

from psycopg.rows import dict_row, tuple_row

from service.store.base import AsyncQueries, SyncQueries


class StatusQueries(AsyncQueries):
    """The worker's metrics."""

    async def metrics_gauges(self) -> tuple[Any, ...] | None:
        """(due, oldest pending age, outbox statements, outbox lag)."""
        return await self._one("metrics_gauges", row=tuple_row)


class SyncStatusQueries(SyncQueries):
    """`webhooks status`: each method one figure's rows, as dicts."""

    def _first(self, name: str) -> dict[str, Any]:
        [row] = self._rows(name, row=dict_row)
        return dict(row)

    def _every(self, name: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows(name, row=dict_row)]

    def status_attachments(self) -> list[dict[str, Any]]:
        """The attached tables."""
        return self._every("status_attachments")

    def status_subscriptions(self) -> dict[str, Any]:
        """The subscriptions' counts."""
        return self._first("status_subscriptions")

    def status_partitions(self) -> list[dict[str, Any]]:
        """The queue's partitions."""
        return self._every("status_partitions")

    def status_deliveries(self) -> dict[str, Any]:
        """The deliveries' counts."""
        return self._first("status_deliveries")

    def status_attempts(self) -> dict[str, Any]:
        """The last hour's attempts."""
        return self._first("status_attempts")

    def status_failing(self) -> list[dict[str, Any]]:
        """The failing subscriptions."""
        return self._every("status_failing")

    def status_lifecycle_counts(self) -> dict[str, Any]:
        """The subscriptions' counts per lifecycle state."""
        return self._first("status_lifecycle_counts")

    def status_lifecycle(self) -> list[dict[str, Any]]:
        """The subscriptions failing or disabled by the lifecycle."""
        return self._every("status_lifecycle")

    def status_stopped(self) -> list[dict[str, Any]]:
        """Subscriptions made inactive by the registry (table detached or dropped, events
        made private), with the reason."""
        return self._every("status_stopped")

    def status_outbox(self) -> dict[str, Any]:
        """The outbox's backlog."""
        return self._first("status_outbox")

    def status_worker_tasks(self) -> list[dict[str, Any]]:
        """The workers' task crashes."""
        return self._every("status_worker_tasks")

    def work_due(self) -> bool:
        """Whether a change waits for fan-out or a delivery is due (the liveness check)."""
        return bool(self._first("work_due")["due"])

    def status_workers(self) -> list[dict[str, Any]]:
        """The workers' LISTEN connections and their last reports (progress and proof)."""
        workers = []
        for row in self._every("status_workers"):
            report = _progress_report(row.pop("query") or "")
            workers.append({**row, "worker": report.get("worker"),
                            "last_round": report.get("round"),
                            "started": report.get("started")})
        return workers

    def status_rejected(self) -> list[dict[str, Any]]:
        """The changes set aside (total, and the latest)."""
        return self._every("status_rejected")


_REPORT = re.compile(r"^SELECT '(.*)' AS webhooks_progress$", re.DOTALL)


def _progress_report(statement: str) -> dict[str, Any]:
    """The JSON a listener's proof carried in its text (prove_listener), or {}."""
    match = _REPORT.match(statement.strip())
    if match is None:
        return {}
    try:
        report = json.loads(match.group(1).replace("''", "'"))
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}
