"""Subscriptions through the REST API: create, get, list, update, delete, ownership."""

from __future__ import annotations

import re

import pytest

from tests.support.api import SUBSCRIPTION_FIELDS, Api, assert_error

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


async def test_create_returns_the_subscription_and_stores_it(api: Api) -> None:
    response = await api.request("POST", "/api/v1/webhooks/", json={
        "resource": "invoices", "events": " create, payment.destroy ,create",
        "target": api.receiver.url})
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) == SUBSCRIPTION_FIELDS
    assert body == {"id": body["id"], "resource": "invoices",
                    "events": "invoice.create,payment.delete", "target": api.receiver.url,
                    "active": True, "last_status": 200, "last_success_at": None,
                    "last_failure_at": None, "last_failure_content": None, "filter": None,
                    "ordering": "unordered", "inactive_reason": None}
    assert isinstance(body["id"], int)
    handshake = api.receiver.received[-1]
    assert handshake.method == "POST"
    secret = handshake.headers["x-hook-secret"]
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{43}=", secret)
    assert handshake.body in (b"", b"{}")
    assert secret not in response.text
    rows = api.sql("SELECT owner, tenant, events, secret, active, last_status "
                   "FROM webhooks.subscriptions")
    assert rows == [("alice", None, ["invoice.create", "payment.delete"], secret, True, 200)]


async def test_tenant_of_the_token_is_stored(api: Api) -> None:
    token = api.new_token("bob", tenant="acme")
    created = await api.create(token=token)
    assert api.sql("SELECT owner, tenant FROM webhooks.subscriptions WHERE id = %s",
                   created["id"]) == [("bob", "acme")]
    listed = (await api.request("GET", "/api/v1/webhooks", token=token)).json()
    assert [s["id"] for s in listed] == [created["id"]]


@pytest.mark.parametrize("slash", ["", "/"])
async def test_every_path_with_and_without_trailing_slash(api: Api, slash: str) -> None:
    created = await api.create()
    one = f"/api/v1/webhooks/{created['id']}{slash}"
    assert (await api.request("GET", "/api/v1/webhooks" + slash)).status_code == 200
    assert (await api.request("GET", "/api/v1/hook_events" + slash)).status_code == 200
    got = await api.request("GET", one)
    assert got.status_code == 200 and got.json() == created
    put = await api.request("PUT", one, json={"active": False})
    assert put.status_code == 200 and put.json()["active"] is False
    gone = await api.request("DELETE", one)
    assert gone.status_code == 204 and gone.content == b""
    posted = await api.request("POST", "/api/v1/webhooks" + slash, json={
        "resource": "invoices", "events": "update", "target": api.receiver.url})
    assert posted.status_code == 201


async def test_hook_events_lists_public_events_only(api: Api) -> None:
    api.sql("SELECT webhooks.attach('public.payments', resource => 'payments', "
            "noun => 'payment', parent_resource => 'invoices', parent_column => 'invoice_id', "
            "public => false)")
    body = [{"resource": e["resource"], "event": e["event"]}  # each with its `schema`
            for e in (await api.request("GET", "/api/v1/hook_events")).json()]
    assert body == [{"resource": "invoices", "event": f"invoice.{v}"}
                    for v in ("create", "delete", "truncate", "update")] + [
                    {"resource": "webhooks", "event": f"webhook.{e}"}  # the operational events
                    for e in ("disabled", "failing", "recovered")]


async def test_get_unknown_foreign_and_odd_ids_are_404(api: Api) -> None:
    created = await api.create()
    other = api.new_token("mallory")
    for path in (f"/api/v1/webhooks/{created['id']}", f"/api/v1/webhooks/{created['id']}/"):
        for method, kwargs in (("GET", {}), ("PUT", {"json": {"active": False}}),
                               ("DELETE", {})):
            assert_error(await api.request(method, path, token=other, **kwargs), 404)
    for odd in ("999999", "0", "-1", "abc", "1.5", "9223372036854775808", "9" * 40, "%00",
                "1e3", "+1", "%20"):
        assert_error(await api.request("GET", f"/api/v1/webhooks/{odd}"), 404)
        assert_error(await api.request("DELETE", f"/api/v1/webhooks/{odd}"), 404)
    assert (await api.request("GET", f"/api/v1/webhooks/{created['id']}")).status_code == 200
    assert (await api.request("GET", "/api/v1/webhooks", token=other)).json() == []


async def test_list_pagination_and_link_header(api: Api) -> None:
    ids = [(await api.create(events=e))["id"] for e in ("create", "update", "delete",
                                                         "create", "update")]
    first = await api.request("GET", "/api/v1/webhooks?limit=2")
    assert [s["id"] for s in first.json()] == ids[:2]
    link = first.headers["link"]
    match = re.fullmatch(r'<(http://[^>]+)>; rel="next"', link)
    assert match, link
    assert f"after={ids[1]}" in match.group(1) and "limit=2" in match.group(1)
    second = await api.http.get(match.group(1), headers=api.auth())
    assert [s["id"] for s in second.json()] == ids[2:4]
    third = await api.http.get(
        re.fullmatch(r"<([^>]+)>.*", second.headers["link"]).group(1),  # type: ignore[union-attr]
        headers=api.auth())
    assert [s["id"] for s in third.json()] == ids[4:]
    assert "link" not in third.headers
    everything = await api.request("GET", "/api/v1/webhooks/")
    assert [s["id"] for s in everything.json()] == ids and "link" not in everything.headers
    exact = await api.request("GET", "/api/v1/webhooks", params={"limit": 5})
    assert len(exact.json()) == 5 and "link" not in exact.headers
    after = await api.request("GET", "/api/v1/webhooks", params={"after": ids[2]})
    assert [s["id"] for s in after.json()] == ids[3:]


async def test_list_filters(api: Api) -> None:
    a = await api.create()
    b = await api.create(events="update")
    await api.request("PUT", f"/api/v1/webhooks/{b['id']}", json={"active": False})

    async def ids(**params: str) -> list[int]:
        response = await api.request("GET", "/api/v1/webhooks", params=params)
        assert response.status_code == 200, response.text
        return [s["id"] for s in response.json()]

    assert await ids(active="true") == [a["id"]]
    assert await ids(active="false") == [b["id"]]
    assert await ids(resource="invoices") == [a["id"], b["id"]]
    assert await ids(resource="payments") == []
    assert await ids(resource="invoices", active="false", limit="1") == [b["id"]]
    for params, fragment in (({"active": "yes"}, "active"), ({"active": "1"}, "active"),
                             ({"active": ""}, "active"), ({"limit": "0"}, "limit"),
                             ({"limit": "1001"}, "limit"), ({"limit": "x"}, "limit"),
                             ({"limit": "9" * 5000}, "limit"), ({"after": "-1"}, "after"),
                             ({"after": "z"}, "after"), ({"after": "9" * 30}, "after"),
                             ({"resource": "in\x00voices"}, "NUL")):
        response = await api.request("GET", "/api/v1/webhooks", params=params)
        assert_error(response, 400, fragment)
    assert await ids(limit="1000") == [a["id"], b["id"]]


async def test_update_changes_only_active(api: Api) -> None:
    created = await api.create(events="create,payment.update")
    path = f"/api/v1/webhooks/{created['id']}"
    off = await api.request("PUT", path, json={"active": False})
    assert off.status_code == 200 and off.json() == {**created, "active": False}
    # Sending back what GET returned, with active changed, works.
    on = await api.request("PUT", path, json={**created, "active": True})
    assert on.status_code == 200 and on.json() == created
    same = {"resource": "invoices", "target": created["target"], "id": created["id"],
            "events": " payment.update , invoice.create,create", "last_status": 500}
    assert (await api.request("PUT", path, json={"active": True, **same})).status_code == 200
    for change, fragment in (({"resource": "payments"}, "resource"),
                             ({"events": "invoice.create"}, "events"),
                             ({"events": "create,payment.update,delete"}, "events"),
                             ({"id": created["id"] + 1}, "id"),
                             ({"id": True}, "id"),
                             ({"secret": "whsec_x"}, "unknown field"),
                             ({"created_at": None}, "unknown field"),
                             ({"colour": "red"}, "unknown field"),
                             ({"events": 1}, "events"),
                             ({"last_status": "200"}, "last_status")):
        response = await api.request("PUT", path, json={"active": False, **change})
        assert_error(response, 400, fragment)
    for body, fragment in (({"active": 1}, "true or false"),
                           ({"active": "false"}, "true or false"),
                           ({"active": None}, "true or false"), ([], "object")):
        assert_error(await api.request("PUT", path, json=body), 400, fragment)
    # Nothing of the refused requests was applied, and a field left out keeps its value.
    assert (await api.request("GET", path)).json() == created
    same = await api.request("PUT", path, json={})
    assert same.status_code == 200 and same.json() == created


async def test_delete_drops_pending_deliveries(api: Api) -> None:
    keep = await api.create()
    drop = await api.create(events="update")
    api.sql("INSERT INTO webhooks.events (id, hook_resource, name, tenant, occurred_at, body) "
            "VALUES (1, 'invoices', 'invoice.create', NULL, now(), '{}')")
    for sub in (keep, drop, drop):
        api.sql("INSERT INTO webhooks.deliveries (event_id, subscription_id) VALUES (1, %s)",
                sub["id"])
    response = await api.request("DELETE", f"/api/v1/webhooks/{drop['id']}/")
    assert response.status_code == 204 and response.content == b""
    assert api.sql("SELECT subscription_id, status FROM webhooks.deliveries") == \
        [(keep["id"], "pending")]
    assert_error(await api.request("GET", f"/api/v1/webhooks/{drop['id']}"), 404)
    assert_error(await api.request("DELETE", f"/api/v1/webhooks/{drop['id']}"), 404)
    assert [s["id"] for s in (await api.request("GET", "/api/v1/webhooks")).json()] == \
        [keep["id"]]


async def test_timestamps_are_rfc3339_utc(api: Api) -> None:
    created = await api.create()
    api.sql("UPDATE webhooks.subscriptions SET last_success_at = "
            "'2026-11-22 03:24:11.87654+01', last_failure_at = '2026-01-02 00:00:00+00', "
            "last_failure_content = 'HTTP 500', last_status = 500 WHERE id = %s",
            created["id"])
    body = (await api.request("GET", f"/api/v1/webhooks/{created['id']}")).json()
    assert body["last_success_at"] == "2026-11-22T02:24:11.876540Z"
    assert body["last_failure_at"] == "2026-01-02T00:00:00.000000Z"
    assert RFC3339.match(body["last_failure_at"])
    assert (body["last_status"], body["last_failure_content"]) == (500, "HTTP 500")


async def test_create_answers_with_location(api: Api) -> None:
    response = await api.request("POST", "/api/v1/webhooks", json={
        "resource": "invoices", "events": "create", "target": api.receiver.url})
    assert response.headers["location"] == f"/api/v1/webhooks/{response.json()['id']}"


async def test_repeated_list_parameters_are_400(api: Api) -> None:
    for query in ("limit=1&limit=2", "resource=invoices&resource=x", "active=true&active=false",
                  "after=1&after=1"):
        name = query.split("=")[0]
        assert_error(await api.request("GET", f"/api/v1/webhooks?{query}"), 400,
                     f"'{name}' is given more than once")
