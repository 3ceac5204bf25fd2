"""TRUNCATE through the API: `<noun>.truncate` is an event a subscription can take
(its capture and fan-out: tests/db/test_truncate.py)."""

from __future__ import annotations

from tests.support.api import Api


async def test_the_api_subscribes_to_truncate(api: Api) -> None:
    body = await api.create("invoice.truncate,create")
    assert body["events"] == "invoice.truncate,invoice.create"
    events = (await api.request("GET", "/api/v1/hook_events")).json()
    assert ("invoices", "invoice.truncate") in [(e["resource"], e["event"]) for e in events]
