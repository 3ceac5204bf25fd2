"""Deliveries of past days, written straight into their partitions, and a delivery
requeued while retention drops them (the retention and partition tests)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from service.worker import pruning


def seed_day(conn: psycopg.Connection, sid: int, days_ago: int, n: int,
             status: str = "succeeded", *, finished_ago: str | None = None,
             attempts: bool = True) -> None:
    """n events and deliveries of subscription `sid` made `days_ago` days ago, in that
    day's partitions (created if need be): finished then, or `finished_ago` (an interval)
    ago, unless pending; each with one attempt unless `attempts` is False."""
    conn.execute("SELECT webhooks.ensure_partitions(now() - make_interval(days => %s),"
                 " now() - make_interval(days => %s))", (days_ago, days_ago))
    conn.execute(
        "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body,"
        "                                      created_at)"
        "  SELECT nextval('webhooks.event_ids'), 'invoices', 'invoice.create', t, '{}', t"
        "    FROM generate_series(1, %(n)s),"
        "         LATERAL (SELECT now() - make_interval(days => %(ago)s)) AS x (t)"
        "  RETURNING id, created_at),"
        " d AS (INSERT INTO webhooks.deliveries (event_id, subscription_id, status, attempts,"
        "                                       created_at, finished_at)"
        "  SELECT e.id, %(sid)s, %(status)s, 1, e.created_at,"
        "         CASE WHEN %(status)s <> 'pending'"
        "              THEN coalesce(now() - %(finished)s::interval, e.created_at) END FROM e"
        "  RETURNING id, created_at)"
        " INSERT INTO webhooks.attempts (delivery_id, subscription_id, attempt, attempted_at,"
        "                                status, duration_ms)"
        " SELECT d.id, %(sid)s, 1, d.created_at, 200, 1 FROM d WHERE %(attempts)s",
        {"n": n, "ago": days_ago, "sid": sid, "status": status, "finished": finished_ago,
         "attempts": attempts})


def requeue_before_the_drop(conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
                            ) -> list[dict[str, Any]]:
    """Makes retention redeliver the oldest delivery just before it detaches the first
    deliveries partition it chose (a delivery requeued between the choice and the drop);
    returns the list that then holds that partition."""
    chosen: list[dict[str, Any]] = []
    real_drop = pruning._drop

    async def requeue_then_drop(s: Any, part: dict[str, Any], retention: float) -> bool:
        if part["parent"] == "deliveries" and not chosen:
            chosen.append(part)
            conn.execute("SELECT webhooks.redeliver(min(id)) FROM webhooks.deliveries")
        return await real_drop(s, part, retention)

    monkeypatch.setattr(pruning, "_drop", requeue_then_drop)
    return chosen
