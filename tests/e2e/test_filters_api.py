"""Filters and change-aware payloads over the API, with a worker: what
integrators receive: only matching changes, event.changed, previous."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from tests.support.api import Api, assert_error
from tests.support.worker import poll, running_worker


def reattach_with_previous(api: Api) -> None:
    api.sql("SELECT webhooks.attach('public.invoices', resource => 'invoices',"
            " noun => 'invoice', user_column => 'updated_by', tenant_column => 'company_id',"
            " include_previous => true)")


async def create(api: Api, **fields: Any) -> Any:
    body = {"resource": "invoices", "target": api.receiver.url, **fields}
    return await api.request("POST", "/api/v1/webhooks/", json=body)


async def test_bad_filters_are_400_and_create_nothing(api: Api) -> None:
    cases = [
        ({"events": "invoice.create", "filter": {"number": {"like": "A%"}}},
         'unknown operator "like"'),
        ({"events": "invoice.create", "filter": {"nope": 1}}, 'no column "nope"'),
        ({"events": "payment.create", "filter": {"card_token": "x"}}, "card_token"),
        ({"events": "invoice.create,payment.create", "filter": {"number": "x"}},
         "not sent by every event"),
        ({"events": "invoice.update", "filter": {"$changed": ["card_token"]}}, "card_token"),
        ({"events": "invoice.create", "filter": "status = 'paid'"}, "must be an object"),
        ({"events": "invoice.create", "ordering": "fifo"}, "ordering"),
    ]
    for fields, fragment in cases:
        assert_error(await create(api, **fields), 400, fragment)
    assert api.sql("SELECT count(*) FROM webhooks.subscriptions") == [(0,)]


async def test_subscription_json_has_filter_and_ordering(api: Api) -> None:
    response = await create(api, events="invoice.update",
                            filter={"status": "paid", "$changed": ["status"]},
                            ordering="strict")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["filter"] == {"status": "paid", "$changed": ["status"]}
    assert body["ordering"] == "strict"
    plain = await api.create("invoice.create")
    assert plain["filter"] is None and plain["ordering"] == "unordered"
    # A PUT may repeat them, not change them.
    url = f"/api/v1/webhooks/{body['id']}"
    ok = await api.request("PUT", url, json={**body, "active": False})
    assert ok.status_code == 200, ok.text
    assert_error(await api.request("PUT", url, json={"active": True, "ordering": "unordered"}),
                 400, "'ordering' cannot be changed")


async def test_only_matching_changes_arrive_with_changed_and_previous(api: Api) -> None:
    reattach_with_previous(api)
    filtered = (await create(api, events="invoice.create,invoice.update",
                             filter={"amount": {"gte": 100}, "$changed": ["status"]})).json()
    everything = await api.create("invoice.update")
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        async with running_worker(api.db_url):
            small, big = (conn.execute(
                "INSERT INTO invoices (number, customer, amount) VALUES (%s, 'c', %s)"
                " RETURNING id", (number, amount)).fetchone()[0]  # type: ignore[index]
                for number, amount in (("F-1", 50), ("F-2", 150)))
            conn.execute("UPDATE invoices SET status = 'paid' WHERE id = %s", (big,))
            conn.execute("UPDATE invoices SET customer = 'd' WHERE id = %s", (big,))
            conn.execute("UPDATE invoices SET status = 'paid' WHERE id = %s", (small,))
            await poll(lambda: conn.execute(
                "SELECT count(*) FROM webhooks.deliveries WHERE status = 'succeeded'"
            ).fetchone() == (5,), what="five deliveries")
    by_sub = api.sql("SELECT d.subscription_id, e.body FROM webhooks.deliveries d"
                     " JOIN webhooks.events e ON e.id = d.event_id ORDER BY d.id")
    mine = [json.loads(b) for s, b in by_sub if s == filtered["id"]]
    theirs = [json.loads(b) for s, b in by_sub if s == everything["id"]]
    # The filtered subscription: the big invoice's create, and its status change only.
    assert [(p["event"]["name"], p["resource"]["number"]) for p in mine] == [
        ("invoice.create", "F-2"), ("invoice.update", "F-2")]
    assert mine[1]["event"]["changed"] == ["status"]
    assert mine[1]["previous"]["status"] == "draft" and mine[1]["resource"]["status"] == "paid"
    assert "changed" not in mine[0]["event"] and "previous" not in mine[0]
    # The other sees every update, each naming what changed.
    assert [p["event"]["changed"] for p in theirs] == [["status"], ["customer"], ["status"]]
    assert len(api.receiver.deliveries()) == 5


async def test_excluded_columns_are_never_named(api: Api) -> None:
    sub = await api.create("payment.update")
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        async with running_worker(api.db_url):
            invoice = conn.execute("INSERT INTO invoices (number, customer, amount)"
                                   " VALUES ('P-1', 'c', 10) RETURNING id").fetchone()
            assert invoice is not None
            conn.execute("INSERT INTO payments (invoice_id, amount, card_token)"
                         " VALUES (%s, 10, 'tok_1')", invoice)
            conn.execute("UPDATE payments SET card_token = 'tok_2'")  # excluded: no event
            conn.execute("UPDATE payments SET card_token = 'tok_3', method = 'wire'")
            await api.receiver.wait_for(lambda r: len(r.deliveries()) >= 1)
            await poll(lambda: conn.execute(
                "SELECT count(*) FROM webhooks.outbox").fetchone() == (0,), what="drained")
    [payload] = [json.loads(r.body) for r in api.receiver.deliveries()]
    assert payload["event"]["changed"] == ["method"]
    assert "tok_" not in json.dumps(payload)
    assert sub["id"]
