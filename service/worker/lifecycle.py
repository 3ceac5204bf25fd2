"""The failure lifecycle, worker side: every few seconds one worker runs webhooks.lifecycle()
(sql/lifecycle.sql), which queues the operational events webhook.failing,
webhook.recovered and webhook.disabled and disables subscriptions that have failed for
WEBHOOKS_DISABLE_AFTER; each is logged once, as a WARNING, and counted here."""

from __future__ import annotations

import logging

from service.config import Settings
from service.store import Store
from service.worker.metrics import WorkerMetrics

log = logging.getLogger("webhooks.lifecycle")

# Rounds come at most this far apart, and a quarter of the shortest lifecycle duration
# apart when that is less (tests use tiny durations), but never closer than MIN_INTERVAL.
MAX_INTERVAL = 5.0
MIN_INTERVAL = 0.05

_MESSAGES = {
    "webhook.failing": "subscription %d (owner %s) is failing: every delivery attempt has "
                       "failed since %s",
    "webhook.recovered": "subscription %d (owner %s) recovered: an attempt succeeded at %s, "
                         "after webhook.failing",
    "webhook.disabled": "subscription %d (owner %s) was disabled automatically: every "
                        "delivery attempt has failed since %s (WEBHOOKS_DISABLE_AFTER)",
}


def interval(settings: Settings) -> float:
    """Seconds between two lifecycle rounds of one worker."""
    durations = [d for d in (settings.failing_after, settings.disable_after) if d > 0]
    shortest = min(durations, default=4 * MAX_INTERVAL)
    return min(MAX_INTERVAL, max(MIN_INTERVAL, shortest / 4))


async def run_round(store: Store, settings: Settings, metrics: WorkerMetrics) -> int:
    """One round (skipped when another worker runs one); returns the deliveries queued."""
    rows = await store.lifecycle_round(failing_after=settings.failing_after,
                                       disable_after=settings.disable_after)
    queued = 0
    for row in rows:
        event = row["event"]
        metrics.lifecycle.labels(event.removeprefix("webhook.")).inc()
        log.warning(_MESSAGES[event], row["subscription_id"], row["owner"],
                    f"{row['since']:%Y-%m-%dT%H:%M:%SZ}" if row["since"] else "?",
                    extra={"subscription_id": row["subscription_id"], "event": event,
                           "queued": row["queued"]})
        queued += row["queued"]
    return queued
