"""Auto-disable: a subscription whose every attempt has failed for
WEBHOOKS_DISABLE_AFTER since its first failure after its last success becomes inactive,
says why and since when, and its pending deliveries fail; a shorter outage changes
nothing; re-activation starts afresh; 0 turns it off. Real receivers, a real worker, tiny
durations."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

from service.commands.status import collect, render
from tests.support.receivers import Receiver, echo_secret, status
from tests.support.subscriptions import subscribe, subscription
from tests.support.worker import add_invoice, numbers, poll, running_worker

# Retries keep coming for the whole outage, as the default schedule's would.
RETRIES = (0.05,) * 400


def lifecycle(conn: psycopg.Connection, sid: int) -> dict[str, Any]:
    return subscription(conn, sid)


def delivery_statuses(conn: psycopg.Connection, sid: int) -> list[str]:
    return [s for (s,) in conn.execute(
        "SELECT status FROM webhooks.deliveries WHERE subscription_id = %s ORDER BY id",
        (sid,))]


async def test_a_dead_target_is_disabled_after_the_outage_lasts(
        db_url: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    async with Receiver(behaviour=status(503, body="down")) as dead, Receiver() as healthy:
        sid, _ = subscribe(conn, dead.url)
        other, _ = subscribe(conn, healthy.url)
        with caplog.at_level(logging.WARNING, logger="webhooks.lifecycle"):
            async with running_worker(db_url, retry_schedule=RETRIES, failing_after=0.2,
                                      disable_after=1.0) as worker:
                for n in range(3):
                    add_invoice(conn, f"DOWN-{n}")
                await poll(lambda: not lifecycle(conn, sid)["active"], timeout=15,
                           what="auto-disable")
                sub = lifecycle(conn, sid)
                # Every queued delivery is closed as failed, none left pending.
                await poll(lambda: "pending" not in delivery_statuses(conn, sid),
                           what="pending deliveries failed")
                await healthy.wait_for(lambda r: len(r.deliveries()) == 3)
                sample = worker.metrics.registry.get_sample_value
                # Counted once the round's statement has returned to the worker: the
                # database may show the change first.
                await poll(lambda: sample("webhooks_subscription_lifecycle_events_total",
                                          {"event": "disabled"}) == 1,
                           what="the disable counted")
                assert sample("webhooks_subscription_lifecycle_events_total",
                              {"event": "disabled"}) == 1
                assert sample("webhooks_subscription_lifecycle_events_total",
                              {"event": "failing"}) == 1
                report = render(collect(conn))
    assert delivery_statuses(conn, sid) == ["failed"] * 3
    assert sub["disabled_at"] is not None and sub["failing_since"] is not None
    assert (sub["disabled_at"] - sub["failing_since"]).total_seconds() >= 1.0
    content = sub["last_failure_content"]
    assert content.startswith("disabled automatically")
    assert f"{sub['failing_since']:%Y-%m-%dT%H:%M:%SZ}" in content.replace("+00:00", "")
    # The healthy subscription of the same owner goes on.
    assert lifecycle(conn, other)["active"]
    assert sorted(numbers(healthy.deliveries())) == ["DOWN-0", "DOWN-1", "DOWN-2"]
    disabled = [r for r in caplog.records if "disabled automatically" in r.getMessage()]
    assert len(disabled) == 1 and disabled[0].levelno == logging.WARNING
    assert f"subscription {sid} " in disabled[0].getMessage()
    assert "1 disabled automatically" in report and f"#{sid}" in report


async def test_an_outage_shorter_than_disable_after_changes_nothing(
        db_url: str, conn: psycopg.Connection) -> None:
    async with Receiver(behaviour=status(503)) as target:
        sid, _ = subscribe(conn, target.url)
        async with running_worker(db_url, retry_schedule=RETRIES, failing_after=30.0,
                                  disable_after=60.0):
            add_invoice(conn, "BLIP")
            await poll(lambda: lifecycle(conn, sid)["failing_since"] is not None,
                       what="the failure recorded")
            await target.wait_for(lambda r: len(r.deliveries()) >= 3)
            target.behaviour = echo_secret
            await poll(lambda: delivery_statuses(conn, sid) == ["succeeded"],
                       what="the delivery succeeded")
            await poll(lambda: lifecycle(conn, sid)["failing_since"] is None,
                       what="the episode ended")
    sub = lifecycle(conn, sid)
    assert sub["active"] and sub["disabled_at"] is None
    assert sub["failing_notified_at"] is None and sub["recovered_at"] is None


async def test_reactivation_starts_afresh_and_recover_brings_the_deliveries_back(
        db_url: str, conn: psycopg.Connection) -> None:
    async with Receiver(behaviour=status(503)) as target:
        sid, _ = subscribe(conn, target.url)
        async with running_worker(db_url, retry_schedule=RETRIES, failing_after=0.2,
                                  disable_after=0.6):
            add_invoice(conn, "LOST-1")
            add_invoice(conn, "LOST-2")
            await poll(lambda: lifecycle(conn, sid)["disabled_at"] is not None, timeout=15,
                       what="auto-disable")
            await poll(lambda: delivery_statuses(conn, sid) == ["failed", "failed"],
                       what="deliveries failed")
            target.behaviour = echo_secret
            conn.execute("UPDATE webhooks.subscriptions SET active = true WHERE id = %s",
                         (sid,))
            sub = lifecycle(conn, sid)
            assert sub["failing_since"] is None and sub["disabled_at"] is None
            assert sub["failing_notified_at"] is None
            conn.execute("SELECT webhooks.recover(%s, now() - interval '1 hour', NULL)",
                         (sid,))
            await poll(lambda: delivery_statuses(conn, sid) == ["succeeded"] * 2,
                       what="recovered deliveries succeeded")
    assert numbers(target.deliveries())[-2:] == ["LOST-1", "LOST-2"]
    assert lifecycle(conn, sid)["active"]


async def test_disable_after_zero_never_disables(db_url: str, conn: psycopg.Connection
                                                 ) -> None:
    async with Receiver(behaviour=status(503)) as target:
        sid, _ = subscribe(conn, target.url)
        async with running_worker(db_url, retry_schedule=RETRIES, failing_after=0.1,
                                  disable_after=0.0):
            add_invoice(conn, "FOREVER")
            # webhook.failing comes, and well after that the subscription is still active.
            await poll(lambda: lifecycle(conn, sid)["failing_notified_at"] is not None,
                       what="webhook.failing")
            await poll(lambda: conn.execute(
                "SELECT failing_notified_at < now() - interval '1 second' "
                "FROM webhooks.subscriptions WHERE id = %s", (sid,)).fetchone() == (True,),
                what="a second of failure past webhook.failing")
            assert lifecycle(conn, sid)["active"]
            assert delivery_statuses(conn, sid) == ["pending"]
