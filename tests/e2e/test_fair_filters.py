"""What one owner's filters may cost everyone, through the API: a total budget per filter
(a 400 naming it), one per owner over its active subscriptions
(WEBHOOKS_MAX_FILTER_BYTES_PER_OWNER), and the compiled filter stored once per
subscription, not once per event in the registry fan-out reads (the budget's arithmetic,
and fan-out's lookups: tests/db/test_fair_filters.py)."""

from __future__ import annotations

from typing import Any

from service import filters
from tests.support.api import Api, api_for, assert_error


async def create(api: Api, filter_: Any, token: str | None = None) -> Any:
    return await api.request("POST", "/api/v1/webhooks/", token=token, json={
        "resource": "invoices", "events": "invoice.create", "target": api.receiver.url,
        "filter": filter_})


def nin(n: int, seed: str) -> dict[str, Any]:
    return {"customer": {"nin": [f"{seed}{i:04}" for i in range(n)]}}


def compiled_bytes(api: Api, filter_: dict[str, Any]) -> int:
    path = filters.compile_path(filter_)
    return int(api.sql("SELECT octet_length(%s::jsonpath::text)", path)[0][0])


async def test_over_the_budget_over_http_is_a_400_naming_it(db_url: str) -> None:
    async with api_for(db_url) as api:
        too_many = {"customer": {"in": [f"c{i}" for i in range(100)]},
                    "number": {"nin": [f"n{i}" for i in range(101)]}}
        assert_error(await create(api, too_many), 400, "array of 1 to 100")
        too_many["number"]["nin"].pop()  # type: ignore[attr-defined]
        too_many["status"] = "paid"
        assert_error(await create(api, too_many), 400, "limit of 200 values")
        assert_error(await create(api, {"customer": {"in": ["x" * 1000] * 9}}), 400,
                     "limit of 8192 bytes")
        assert api.sql("SELECT count(*) FROM webhooks.subscriptions") == [(0,)]
        assert len(api.receiver.received) == 0  # refused before the handshake


async def test_an_owner_has_a_filter_budget_over_its_active_subscriptions(
        db_url: str) -> None:
    async with api_for(db_url) as probe:
        one = compiled_bytes(probe, nin(50, "a"))
    async with api_for(db_url, max_filter_bytes_per_owner=2 * one + one // 2) as api:
        first = await create(api, nin(50, "a"))
        second = await create(api, nin(50, "b"))
        assert (first.status_code, second.status_code) == (201, 201), second.text
        handshakes = len(api.receiver.received)
        message = assert_error(await create(api, nin(50, "c")), 400,
                               "WEBHOOKS_MAX_FILTER_BYTES_PER_OWNER")
        assert str(2 * one + one // 2) in message and str(2 * one) in message
        assert len(api.receiver.received) == handshakes  # the target is not bothered
        # Without a filter, or for another owner, nothing is counted against it.
        await api.create()
        bob = api.new_token("bob")
        assert (await create(api, nin(50, "c"), token=bob)).status_code == 201
        # A paused subscription's filter costs nothing: pausing one makes room ...
        url = f"/api/v1/webhooks/{first.json()['id']}"
        assert (await api.request("PUT", url, json={"active": False})).status_code == 200
        third = await create(api, nin(50, "c"))
        assert third.status_code == 201, third.text
        # ... and re-activating it past the budget is refused and leaves it paused.
        assert_error(await api.request("PUT", url, json={"active": True}), 400,
                     "WEBHOOKS_MAX_FILTER_BYTES_PER_OWNER")
        assert api.sql("SELECT active FROM webhooks.subscriptions WHERE id = %s",
                       first.json()["id"]) == [(False,)]


async def test_the_registry_holds_no_copy_of_the_filter(db_url: str) -> None:
    async with api_for(db_url) as api:
        created = await api.request("POST", "/api/v1/webhooks/", json={
            "resource": "invoices", "target": api.receiver.url,
            "events": "invoice.create,invoice.update,invoice.delete",
            "filter": nin(100, "x")})
        assert created.status_code == 201, created.text
        columns = {r[0] for r in api.sql(
            "SELECT attname FROM pg_attribute WHERE attrelid ="
            " 'webhooks.subscription_events'::regclass AND attnum > 0 AND NOT attisdropped")}
        assert "filter_path" not in columns
        rows = api.sql("SELECT event, filtered FROM webhooks.subscription_events"
                       " ORDER BY event")
        assert rows == [("invoice.create", True), ("invoice.delete", True),
                        ("invoice.update", True)]
        # Without the snapshot each row took at, which lists the transactions then in
        # progress on the whole server (other tests' too).
        (size,) = api.sql("SELECT sum(pg_column_size(se.*) - pg_column_size(se.active_since))"
                          " FROM webhooks.subscription_events se")[0]
        assert size < 1000  # three small rows, whatever the filter's size
