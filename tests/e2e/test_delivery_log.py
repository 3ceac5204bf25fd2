"""The delivery log: list with filters and cursor pages, one delivery with
its payload as sent and its attempts, scoping, 400s, the index, test events."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import psycopg
from standardwebhooks.webhooks import Webhook

from service import db
from tests.support.api import Api, assert_error
from tests.support.worker import add_invoice, poll, running_worker

DELIVERY_FIELDS = {"id", "event", "event_id", "status", "attempts", "created_at",
                   "next_attempt_at", "finished_at", "last_status"}
ATTEMPT_FIELDS = {"attempt", "attempted_at", "status", "duration_ms", "error"}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def seed(conn: psycopg.Connection, sid: int, specs: list[tuple[str, str, str]]) -> list[int]:
    """One event and one delivery per (event name, status, created_at); returns the ids."""
    ids = []
    for name, status, created in specs:
        conn.execute("SELECT webhooks.ensure_partitions(%s::timestamptz, %s::timestamptz)",
                     (created, created))
        row = conn.execute(
            "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
            " VALUES (nextval('webhooks.event_ids'), 'invoices', %s, %s::timestamptz,"
            " json_build_object('event', json_build_object('name', %s::text))::text)"
            " RETURNING id)"
            " INSERT INTO webhooks.deliveries (event_id, subscription_id, status, created_at,"
            " finished_at) SELECT e.id, %s, %s, %s::timestamptz,"
            " CASE WHEN %s <> 'pending' THEN %s::timestamptz END FROM e RETURNING id",
            (name, created, name, sid, status, created, status, created)).fetchone()
        assert row is not None
        ids.append(row[0])
    return ids


async def test_list_and_show_what_was_sent(api: Api) -> None:
    sub = await api.create("invoice.create")
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        async with running_worker(api.db_url):
            add_invoice(conn, "LOG-1")
            add_invoice(conn, "LOG-2")
            await poll(lambda: conn.execute(
                "SELECT count(*) FROM webhooks.deliveries WHERE status = 'succeeded'"
            ).fetchone() == (2,), what="two deliveries succeeded")
    response = await api.request("GET", f"/api/v1/webhooks/{sub['id']}/deliveries")
    assert response.status_code == 200, response.text
    page = response.json()
    assert [set(d) for d in page] == [DELIVERY_FIELDS] * 2
    assert page[0]["id"] > page[1]["id"]  # newest first
    assert "link" not in response.headers
    for d in page:
        assert d["event"] == "invoice.create" and d["status"] == "succeeded"
        assert d["attempts"] == 1 and d["last_status"] == 200
        assert d["next_attempt_at"] is None
        assert RFC3339.match(d["created_at"]) and RFC3339.match(d["finished_at"])

    # The single view: the payload as the receiver got it, the attempt log.
    response = await api.request("GET", f"/api/v1/webhooks/{sub['id']}/deliveries/"
                                        f"{page[1]['id']}/")
    assert response.status_code == 200, response.text
    one = response.json()
    assert set(one) == DELIVERY_FIELDS | {"payload", "attempt_log"}
    received = [r for r in api.receiver.deliveries()
                if r.headers["webhook-id"].removeprefix("msg_") == str(page[1]["id"])]
    assert len(received) == 1
    assert one["payload"] == json.loads(received[0].body)
    assert one["payload"]["resource"]["number"] == "LOG-1"
    assert one["event_id"] == one["payload"]["event"]["id"]
    [attempt] = one["attempt_log"]
    assert set(attempt) == ATTEMPT_FIELDS
    assert attempt["attempt"] == 1 and attempt["status"] == 200 and attempt["error"] is None
    assert RFC3339.match(attempt["attempted_at"]) and attempt["duration_ms"] >= 0


async def test_filters_and_pages(api: Api) -> None:
    sub = await api.create("invoice.create")
    sid = sub["id"]
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        ids = seed(conn, sid, [
            ("invoice.create", "failed", "2026-01-01T00:00:00Z"),
            ("invoice.update", "succeeded", "2026-01-02T00:00:00Z"),
            ("invoice.create", "failed", "2026-01-03T00:00:00Z"),
            ("invoice.create", "pending", "2026-01-04T00:00:00Z"),
            ("invoice.delete", "succeeded", "2026-01-05T00:00:00Z"),
        ])
        # Another subscription's deliveries never show.
        other = conn.execute(
            "INSERT INTO webhooks.subscriptions (owner, resource, events, target, secret)"
            " VALUES ('alice', 'invoices', '{invoice.create}', 'http://x/', 's')"
            " RETURNING id").fetchone()
        assert other is not None
        seed(conn, other[0], [("invoice.create", "failed", "2026-01-03T12:00:00Z")])

    async def listed(query: str) -> list[int]:
        response = await api.request("GET", f"/api/v1/webhooks/{sid}/deliveries?{query}")
        assert response.status_code == 200, response.text
        return [d["id"] for d in response.json()]

    assert await listed("") == ids[::-1]
    assert await listed("status=failed") == [ids[2], ids[0]]
    assert await listed("event=invoice.create") == [ids[3], ids[2], ids[0]]
    assert await listed("since=2026-01-02T00:00:00Z&until=2026-01-04T00:00:00%2B00:00") == [
        ids[2], ids[1]]
    assert await listed("since=2026-01-03T01:00:00%2B01:00") == [ids[4], ids[3], ids[2]]
    assert await listed("status=failed&event=invoice.create&until=2026-01-02T00:00:00Z") == [
        ids[0]]
    assert await listed("status=pending&event=invoice.update") == []
    response = await api.request("GET", f"/api/v1/webhooks/{sid}/deliveries?status=pending")
    [pending] = response.json()
    assert pending["next_attempt_at"] is not None and pending["finished_at"] is None

    # Pages of two, following the Link header to the end.
    seen: list[int] = []
    url: str | None = f"/api/v1/webhooks/{sid}/deliveries?limit=2&event=invoice.create"
    pages = 0
    while url:
        response = await api.request("GET", url)
        assert response.status_code == 200, response.text
        seen += [d["id"] for d in response.json()]
        link = response.headers.get("link")
        url = None
        if link:
            match = re.match(r'^<([^>]+)>; rel="next"$', link)
            assert match, link
            url = match.group(1)
            assert "event=invoice.create" in url and "limit=2" in url
        pages += 1
    assert seen == [ids[3], ids[2], ids[0]] and pages == 2
    assert await listed(f"before={ids[2]}") == [ids[1], ids[0]]


BAD_FILTERS = [
    ("status=done", "status must be one of pending, succeeded, failed"),
    ("since=yesterday", "since must be an RFC 3339 timestamp"),
    ("since=2026-01-01T00:00:00", "time zone"),
    ("until=2026-01-01", "until must be an RFC 3339"),
    ("until=2026-13-01T00:00:00Z", "until must be an RFC 3339"),
    ("limit=0", "limit must be an integer from 1 to 1000"),
    ("limit=1001", "limit must be an integer from 1 to 1000"),
    ("before=-3", "before must be a delivery id"),
    ("before=x", "before must be a delivery id"),
    ("status=failed&status=pending", "'status' is given more than once"),
    ("event=a%00b", "NUL"),
]


async def test_bad_filters_are_400(api: Api) -> None:
    sub = await api.create("invoice.create")
    for query, fragment in BAD_FILTERS:
        response = await api.request("GET", f"/api/v1/webhooks/{sub['id']}/deliveries?{query}")
        assert_error(response, 400, fragment)


async def test_scoped_like_subscriptions(api: Api) -> None:
    sub = await api.create("invoice.create")
    mine = await api.create("invoice.update")
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        [delivery] = seed(conn, sub["id"], [("invoice.create", "failed", "2026-01-01T00:00Z")])
    base = f"/api/v1/webhooks/{sub['id']}"
    requests: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", f"{base}/deliveries", None),
        ("GET", f"{base}/deliveries/{delivery}", None),
        ("POST", f"{base}/deliveries/{delivery}/redeliver", None),
        ("POST", f"{base}/recover", {"since": "2020-01-01T00:00:00Z"}),
        ("POST", f"{base}/test", None),
    ]
    for token in (api.new_token("mallory"), api.new_token("alice", tenant="t1")):
        for method, path, body in requests:
            response = await api.request(method, path, token=token, json=body)
            assert_error(response, 404, f"no webhook with id {sub['id']}")
    # A delivery of another subscription of the same owner is unknown under this one.
    for method, suffix in (("GET", ""), ("POST", "/redeliver")):
        response = await api.request(
            method, f"/api/v1/webhooks/{mine['id']}/deliveries/{delivery}{suffix}")
        assert_error(response, 404, f"no delivery with id {delivery}")
    for bad in ("0", "x", "99999999999999999999"):
        response = await api.request("GET", f"{base}/deliveries/{bad}")
        assert_error(response, 404, "no delivery")
    response = await api.request("GET", "/api/v1/webhooks/123456/deliveries")
    assert_error(response, 404, "no webhook with id 123456")
    response = await api.request("GET", f"{base}/deliveries", headers={})
    assert_error(response, 401)


async def test_test_event_is_signed_delivered_and_logged(api: Api) -> None:
    # Subscribed to payments only: the test event goes to it all the same.
    sub = await api.create("payment.delete")
    other = await api.create("invoice.create")
    async with running_worker(api.db_url):
        response = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/test")
        assert response.status_code == 202, response.text
        delivery = response.json()
        assert set(delivery) == DELIVERY_FIELDS
        assert delivery["event"] == "webhook.test" and delivery["status"] == "pending"
        await api.receiver.wait_for(lambda r: len(r.deliveries()) == 1)
        await poll(lambda: api.sql("SELECT status FROM webhooks.deliveries WHERE id = %s",
                                   delivery["id"]) == [("succeeded",)], what="test recorded")
    [received] = api.receiver.deliveries()
    assert received.headers["webhook-id"].removeprefix("msg_") == str(delivery["id"])
    body = json.loads(received.body)
    assert body == {"event": {
        "id": delivery["event_id"], "name": "webhook.test", "resource": "webhooks",
        "resource_id": sub["id"], "user_id": "alice",
        "occurred_at": body["event"]["occurred_at"]}}
    assert RFC3339.match(body["event"]["occurred_at"])
    [(secret,)] = api.sql("SELECT secret FROM webhooks.subscriptions WHERE id = %s", sub["id"])
    Webhook(secret).verify(received.body, {k: v for k, v in received.headers.items()
                                           if k.startswith("webhook-")})
    # Logged like any other, and only for this subscription.
    response = await api.request("GET", f"/api/v1/webhooks/{sub['id']}/deliveries/"
                                        f"{delivery['id']}")
    one = response.json()
    assert one["status"] == "succeeded" and one["payload"] == body
    assert [a["status"] for a in one["attempt_log"]] == [200]
    response = await api.request("GET", f"/api/v1/webhooks/{other['id']}/deliveries")
    assert response.json() == []

    await api.request("PUT", f"/api/v1/webhooks/{sub['id']}", json={"active": False})
    response = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/test")
    assert_error(response, 409, "inactive")


def test_newest_page_is_an_index_scan(conn: psycopg.Connection) -> None:
    """A subscription with 200,000 deliveries (among others') lists its newest page by a
    backward scan of deliveries_log_idx: no Sort over the subscription's rows."""
    big = conn.execute(
        "INSERT INTO webhooks.subscriptions (owner, resource, events, target, secret)"
        " SELECT 'o', 'invoices', '{invoice.create}', 'http://x/', 's'"
        " FROM generate_series(1, 3) RETURNING id").fetchall()
    sid = big[0][0]
    # 200,000 deliveries of the subscription, interleaved with as many of two others.
    conn.execute("SELECT webhooks.ensure_partitions(now() - interval '5 days', now())")
    conn.execute(
        "INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
        " SELECT i, 'invoices', 'invoice.create', now(), '{}' FROM generate_series(1, 400000) i")
    conn.execute(
        "INSERT INTO webhooks.deliveries (event_id, subscription_id, status, created_at,"
        " finished_at)"
        " SELECT i, CASE WHEN i %% 2 = 0 THEN %s WHEN i %% 4 = 1 THEN %s ELSE %s END,"
        " CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'succeeded' END,"
        " now() - make_interval(secs => 400000 - i), now()"
        " FROM generate_series(1, 400000) i", (sid, big[1][0], big[2][0]))
    conn.execute("ANALYZE webhooks.deliveries")
    conn.execute("ANALYZE webhooks.events")
    query = db.query("deliveries_list")
    cases: dict[str, dict[str, Any]] = {
        "newest": {},
        "failed": {"status": "failed"},
        "next page": {"before": 300000},
        "window": {"since": "2000-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z"},
    }
    for name, filters in cases.items():
        params = {"subscription_id": sid, "status": None, "event": None, "since": None,
                  "until": None, "before": None, "limit": 101, **filters}
        rows = conn.execute(("EXPLAIN (ANALYZE, COSTS OFF) " + query).encode(),
                            params).fetchall()
        plan = "\n".join(r[0] for r in rows)
        # Each day's partition's copy of deliveries_log_idx, newest day first (Append, not
        # Merge Append: the days are in order), older days never touched once the page
        # is full.
        assert "Index Scan Backward using deliveries_p" in plan, plan
        assert "subscription_id_created_at_id_idx" in plan, plan
        assert "Merge Append" not in plan.split("SubPlan")[0], plan
        # No Sort over the subscription's deliveries (the last-status lookup per row of the
        # page may sort that delivery's few attempts).
        assert not re.search(r"Sort Key: d\\.", plan), plan
        assert "Rows Removed by Filter" not in plan.split("SubPlan")[0] or name != "newest", plan
        started = time.perf_counter()
        page = conn.execute(query.encode(), params).fetchall()
        elapsed = time.perf_counter() - started
        assert len(page) == 101
        assert elapsed < 0.5, (name, elapsed)
