"""What the API and the CLI show is exact: the payload in the delivery log is the body as
sent (a numeric 42.00 stays 42.00), `webhooks status --json` gives numbers as numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg

from service.store import Store
from tests.support.api import Api
from tests.support.fanout import drain_outbox
from tests.support.worker import add_invoice, open_pool


async def test_the_log_shows_the_payload_as_sent(api: Api) -> None:
    sub = await api.create()
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        add_invoice(conn, "INV-EXACT", amount="42.00")
    async with open_pool(api.db_url) as pool:
        await drain_outbox(Store(pool), 100)
    [(delivery_id, body)] = api.sql("SELECT d.id, e.body FROM webhooks.deliveries d"
                                    " JOIN webhooks.events e ON e.id = d.event_id")
    assert '"amount": 42.00' in body or '"amount":42.00' in body, body
    response = await api.request("GET", f"/api/v1/webhooks/{sub['id']}/deliveries/"
                                        f"{delivery_id}")
    assert response.status_code == 200
    assert '42.00' in response.text and '42.0,' not in response.text
    env = {**os.environ, "DATABASE_URL": api.db_url}
    shown = subprocess.run([sys.executable, "-m", "service", "deliveries", "show",
                            str(delivery_id)], env=env, capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "42.00" in shown.stdout
    assert json.loads(shown.stdout)["subscription_id"] == sub["id"]
    status = subprocess.run([sys.executable, "-m", "service", "status", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    seconds = json.loads(status.stdout)["deliveries"]["oldest_pending_seconds"]
    assert isinstance(seconds, int | float) and seconds >= 0, seconds


async def test_one_json_style_for_every_answer(api: Api) -> None:
    created = await api.request("POST", "/api/v1/webhooks/", json={
        "resource": "invoices", "events": "invoice.create", "target": api.receiver.url})
    one = await api.request("GET", f"/api/v1/webhooks/{created.json()['id']}")
    listed = await api.request("GET", "/api/v1/webhooks/")
    for response in (created, one, listed):
        assert response.status_code in (200, 201)
        assert response.text == json.dumps(response.json(), separators=(",", ":"),
                                           ensure_ascii=False), response.text


async def test_stats_count_attempts_per_hour(api: Api) -> None:
    sub = await api.create()
    other = await api.create(token=api.new_token("mallory"))
    api.sql("SELECT webhooks.ensure_partitions(now() - interval '3 hours', now())")
    # Three attempts this hour (2xx, 503, no answer) and one two hours ago, of one delivery
    # each; another subscription's attempt is not counted.
    for sid, ago, status in ((sub["id"], 0, 200), (sub["id"], 0, 503), (sub["id"], 0, 0),
                             (sub["id"], 2, 200), (other["id"], 0, 200)):
        api.sql(
            "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
            " VALUES (nextval('webhooks.event_ids'), 'invoices', 'invoice.create', now(), '{}')"
            " RETURNING id), d AS (INSERT INTO webhooks.deliveries (event_id, subscription_id,"
            " created_at) SELECT e.id, %s, date_trunc('hour', now()) - make_interval(hours => %s)"
            " FROM e RETURNING id, created_at)"
            " INSERT INTO webhooks.attempts (delivery_id, subscription_id, attempt, attempted_at,"
            " status, duration_ms) SELECT d.id, %s, 1, d.created_at, %s, 1 FROM d",
            sid, ago, sid, status)
    got = (await api.request("GET", f"/api/v1/webhooks/{sub['id']}/stats?hours=3")).json()
    assert got["hours"] == 3 and len(got["buckets"]) == 3
    assert [(b["succeeded"], b["failed"], b["unanswered"]) for b in got["buckets"]] == \
        [(1, 0, 0), (0, 0, 0), (1, 1, 1)]
    assert got["buckets"][-1]["hour"].endswith(":00:00Z")
    day = (await api.request("GET", f"/api/v1/webhooks/{sub['id']}/stats")).json()
    assert day["hours"] == 24 and len(day["buckets"]) == 24
    for bad in ("0", "169", "x", "1.5"):
        response = await api.request("GET", f"/api/v1/webhooks/{sub['id']}/stats?hours={bad}")
        assert response.status_code == 400 and "hours" in response.json()["error"]
    theirs = await api.request("GET", f"/api/v1/webhooks/{other['id']}/stats")
    assert theirs.status_code == 404


async def test_put_moves_the_target_after_the_handshake(api: Api) -> None:
    from tests.support.receivers import Receiver, status

    sub = await api.create()
    api.sql("UPDATE webhooks.subscriptions SET last_status = 200 WHERE id = %s", sub["id"])
    [(secret,)] = api.sql("SELECT secret FROM webhooks.subscriptions WHERE id = %s", sub["id"])
    async with Receiver() as refusing, Receiver() as moved:
        refusing.behaviour = status(503)
        refused = await api.request("PUT", f"/api/v1/webhooks/{sub['id']}",
                                    json={"active": True, "target": refusing.url})
        assert refused.status_code == 400, refused.text
        assert "target verification failed, the target is unchanged" in refused.json()["error"]
        # The URL nobody verified got a newly made secret, never the live one, and nothing
        # changed.
        [tried] = refusing.received
        assert tried.headers["x-hook-secret"].startswith("whsec_")
        assert tried.headers["x-hook-secret"] != secret
        assert api.sql("SELECT target, secret, previous_secret FROM webhooks.subscriptions"
                       " WHERE id = %s", sub["id"]) == [(api.receiver.url, secret, None)]
        # Only the target: `active` left out keeps its value.
        ok = await api.request("PUT", f"/api/v1/webhooks/{sub['id']}",
                               json={"target": moved.url})
        assert ok.status_code == 200, ok.text
        assert ok.json()["target"] == moved.url and ok.json()["id"] == sub["id"]
        assert ok.json()["active"] is True and "secret" not in ok.json()
        # The handshake's new secret signs from now on, the old one beside it for the
        # rotation overlap.
        [handshake] = moved.received
        new = handshake.headers["x-hook-secret"]
        assert new.startswith("whsec_") and new not in (secret, tried.headers["x-hook-secret"])
        assert api.sql("SELECT secret, previous_secret, previous_secret_expires_at > now()"
                       " FROM webhooks.subscriptions WHERE id = %s", sub["id"]) == [
            (new, secret, True)]
        # An empty body changes nothing.
        same = await api.request("PUT", f"/api/v1/webhooks/{sub['id']}", json={})
        assert same.status_code == 200, same.text
        assert same.json() == ok.json()
        bad = await api.request("PUT", f"/api/v1/webhooks/{sub['id']}",
                                json={"active": True, "target": "ftp://example.com/"})
        assert bad.status_code == 400
