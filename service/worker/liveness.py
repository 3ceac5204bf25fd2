"""The worker's liveness check: whether an orchestrator should restart it.

It fails only when the worker is stuck: it completed no round of its loop for
WEBHOOKS_LIVENESS_TIMEOUT, while the database answers and work is due (a change waits for
fan-out or a delivery is due), and it has been so for RECOVERY seconds at least (the
time a worker takes to resume after an outage). A database that does not answer never
fails it (readiness says that, and a restart would not help), nor does an idle worker.
The check runs in the thread of whatever serves it (the worker's metrics server, or the
API's thread pool in `webhooks run`), apart from the worker's event loop, so a loop that
is blocked is found out too.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from service.config import Settings
from service.store import work_due


class Progress(Protocol):
    """What the check reads of the worker."""

    started_at: float
    last_round: float | None


# After an outage the worker needs a moment to make progress again (its connections are
# replaced within 30 s): the check fails only once the database has answered, with work
# due and no progress, for this long (or WEBHOOKS_LIVENESS_TIMEOUT, if shorter).
RECOVERY = 30.0


class Liveness:
    """The liveness check of one worker (`watch` tells it which, once it runs)."""

    def __init__(self, settings: Settings, worker: Progress | None = None) -> None:
        self.settings = settings
        self.worker = worker
        # When the check first found the database answering with work due while the
        # worker made no progress (reset by anything else).
        self._stuck_since: float | None = None

    def watch(self, worker: Progress) -> None:
        """Checks `worker` from now on."""
        self.worker = worker

    def check(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body): 200 while alive, 503 when stuck."""
        worker = self.worker
        if worker is None:
            return 200, {"status": "starting"}
        now = time.time()
        last = worker.last_round or worker.started_at
        idle = now - last
        body: dict[str, Any] = {"last_round": worker.last_round,
                                "seconds_since_progress": round(idle, 3)}
        if idle < self.settings.liveness_timeout:
            self._stuck_since = None
            return 200, {"status": "ok", **body}
        due = work_due(self.settings.database_url,
                       min(self.settings.worker_db_timeout, self.settings.liveness_timeout))
        if due is None:
            self._stuck_since = None
            return 200, {"status": "ok", "database": "unreachable", **body}
        if not due:
            self._stuck_since = None
            return 200, {"status": "ok", "work_due": False, **body}
        if self._stuck_since is None:
            self._stuck_since = now
        if time.time() - self._stuck_since < min(RECOVERY, self.settings.liveness_timeout):
            return 200, {"status": "recovering", "work_due": True, **body}
        return 503, {"status": "stuck", "work_due": True, **body,
                     "error": f"no progress for {idle:.0f}s while work is due "
                              f"(WEBHOOKS_LIVENESS_TIMEOUT {self.settings.liveness_timeout:g}s)"}
