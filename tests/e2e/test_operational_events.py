"""Operational events: webhook.failing, webhook.recovered and
webhook.disabled under resource `webhooks`, queued once per episode to the same owner's
(and tenant's) subscriptions to them, never about themselves; signed like any delivery.
Real receivers (an outage is a receiver answering 503), a real worker, tiny durations."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from standardwebhooks.webhooks import Webhook

from tests.support.api import Api
from tests.support.receivers import Receiver, echo_secret, status
from tests.support.worker import add_invoice, payloads, poll, running_worker

OPERATIONAL = "webhook.failing,webhook.recovered,webhook.disabled"
RETRIES = (0.05,) * 400


def notices(receiver: Receiver) -> list[tuple[str, int]]:
    """(event name, subscription id) of the operational events a receiver got."""
    return [(p["event"]["name"], p["event"]["resource_id"])
            for p in payloads(receiver.deliveries()) if p["event"]["resource"] == "webhooks"]


def secret_of(api: Api, sid: int) -> str:
    ((secret,),) = api.sql("SELECT secret FROM webhooks.subscriptions WHERE id = %s", sid)
    return str(secret)


async def test_the_registry_offers_the_operational_events(api: Api) -> None:
    # Each entry also carries its body's schema (tests/e2e/test_event_schemas.py).
    listed = [{"resource": e["resource"], "event": e["event"]}
              for e in (await api.request("GET", "/api/v1/hook_events")).json()]
    assert {"resource": "webhooks", "event": "webhook.failing"} in listed
    assert {"resource": "webhooks", "event": "webhook.recovered"} in listed
    assert {"resource": "webhooks", "event": "webhook.disabled"} in listed
    created = await api.create(events=OPERATIONAL, resource="webhooks")
    assert created["events"] == OPERATIONAL and created["resource"] == "webhooks"
    wrong = await api.request("POST", "/api/v1/webhooks", json={
        "resource": "webhooks", "events": "webhook.test", "target": api.receiver.url})
    assert wrong.status_code == 400


async def test_failing_then_recovered_once_each_signed_with_the_subscription_json(
        api: Api, db_url: str, conn: psycopg.Connection,
        caplog: pytest.LogCaptureFixture) -> None:
    async with Receiver() as subject_target, Receiver() as watcher_target:
        subject = await api.create(target=subject_target.url)
        watcher = await api.create(events=OPERATIONAL, resource="webhooks",
                                   target=watcher_target.url)
        subject_target.behaviour = status(503, body="maintenance")
        with caplog.at_level(logging.WARNING, logger="webhooks.lifecycle"):
            async with running_worker(db_url, retry_schedule=RETRIES, failing_after=0.3,
                                      disable_after=60.0) as worker:
                add_invoice(conn, "OUTAGE")
                await watcher_target.wait_for(lambda r: len(notices(r)) == 1)
                failing = watcher_target.deliveries()[0]
                # The subject is still failing: no second webhook.failing for this episode.
                await subject_target.wait_for(lambda r: len(r.deliveries()) >= 10)
                subject_target.behaviour = echo_secret
                await watcher_target.wait_for(lambda r: len(notices(r)) == 2)
                sample = worker.metrics.registry.get_sample_value
                counts = {e: sample("webhooks_subscription_lifecycle_events_total",
                                    {"event": e}) for e in ("failing", "recovered")}
    assert notices(watcher_target) == [("webhook.failing", subject["id"]),
                                       ("webhook.recovered", subject["id"])]
    assert counts == {"failing": 1, "recovered": 1}
    body: dict[str, Any] = payloads([failing])[0]
    assert set(body["event"]) == {"id", "name", "resource", "resource_id", "user_id",
                                  "occurred_at"}
    shown = body["resource"]
    assert shown["id"] == subject["id"] and shown["target"] == subject_target.url
    assert shown["active"] is True and shown["last_failure_content"] == "maintenance"
    assert "secret" not in shown
    headers = {k.lower(): v for k, v in failing.headers.items()}
    Webhook(secret_of(api, watcher["id"])).verify(failing.body, headers)
    lines = [r for r in caplog.records if r.name == "webhooks.lifecycle"]
    assert [r.levelno for r in lines] == [logging.WARNING] * 2
    assert "is failing" in lines[0].getMessage() and "recovered" in lines[1].getMessage()


async def test_disabled_carries_the_inactive_subscription(
        api: Api, db_url: str, conn: psycopg.Connection) -> None:
    async with Receiver() as subject_target, Receiver() as watcher_target:
        subject = await api.create(target=subject_target.url)
        await api.create(events="webhook.disabled", resource="webhooks",
                         target=watcher_target.url)
        subject_target.behaviour = status(503)
        async with running_worker(db_url, retry_schedule=RETRIES, failing_after=0.1,
                                  disable_after=0.5):
            add_invoice(conn, "DEAD")
            await watcher_target.wait_for(lambda r: len(notices(r)) == 1)
    assert notices(watcher_target) == [("webhook.disabled", subject["id"])]
    shown = payloads(watcher_target.deliveries())[0]["resource"]
    assert shown["active"] is False
    assert shown["last_failure_content"].startswith("disabled automatically")


async def test_only_the_same_owner_and_tenant_never_about_itself(
        api: Api, db_url: str, conn: psycopg.Connection) -> None:
    tenant_token = api.new_token("alice", "acme")
    bob = api.new_token("bob")
    async with Receiver() as s_target, Receiver() as s2_target, Receiver() as w1_target, \
            Receiver() as w2_target, Receiver() as t1_target, Receiver() as b_target:
        s = await api.create(target=s_target.url)
        s2 = await api.create(target=s2_target.url, token=tenant_token)
        w1 = await api.create(events=OPERATIONAL, resource="webhooks", target=w1_target.url)
        await api.create(events=OPERATIONAL, resource="webhooks", target=w2_target.url)
        await api.create(events=OPERATIONAL, resource="webhooks", target=t1_target.url,
                         token=tenant_token)
        await api.create(events=OPERATIONAL, resource="webhooks", target=b_target.url,
                         token=bob)
        for target in (s_target, s2_target, w1_target):
            target.behaviour = status(503)
        async with running_worker(db_url, retry_schedule=RETRIES, failing_after=0.2,
                                  disable_after=60.0):
            add_invoice(conn, "ACME", company="acme")
            # w1 fails on the notices it gets, and so becomes failing itself.
            await w2_target.wait_for(lambda r: ("webhook.failing", w1["id"]) in notices(r))
            await t1_target.wait_for(lambda r: len(notices(r)) == 1)
            await poll(lambda: ("webhook.failing", s2["id"]) in notices(w1_target),
                       what="w1 asked about s2")
    assert sorted(set(notices(w2_target))) == sorted(
        {("webhook.failing", s["id"]), ("webhook.failing", s2["id"]),
         ("webhook.failing", w1["id"])})
    # w1's own failure went to w2 only (every retry of it is the same notice).
    assert ("webhook.failing", w1["id"]) not in notices(w1_target)
    # The tenant's watcher hears only of the tenant's subscription; bob of nothing.
    assert set(notices(t1_target)) == {("webhook.failing", s2["id"])}
    assert notices(b_target) == []

