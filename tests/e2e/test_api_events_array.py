"""`events` as a JSON array as well as comma-separated text, in POST and PUT."""

from __future__ import annotations

from typing import Any

from tests.support.api import Api, assert_error


async def test_events_as_an_array_make_the_same_subscription(api: Api) -> None:
    response = await api.request("POST", "/api/v1/webhooks/", json={
        "resource": "invoices", "events": ["invoice.create", "payment.update"],
        "target": api.receiver.url})
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["events"] == "invoice.create,payment.update"
    same = await api.request("PUT", f"/api/v1/webhooks/{created['id']}/", json={
        "active": False, "events": ["payment.update", "invoice.create"]})
    assert same.status_code == 200, same.text
    assert same.json()["active"] is False


async def test_a_bad_array_is_refused_and_nothing_made(api: Api) -> None:
    # The forms of a bad array, for each body type: tests/unit/test_bodies.py.
    cases: list[tuple[Any, str]] = [
        ([], "at least one"),
        ([1], "array of strings"),
        (["invoice.create,invoice.update"], "each item names one event"),
        ({"a": 1}, "a string or an array of strings"),
        (["invoice.nope"], "invoice.nope"),
    ]
    for events, says in cases:
        response = await api.request("POST", "/api/v1/webhooks/", json={
            "resource": "invoices", "events": events, "target": api.receiver.url})
        assert_error(response, 400, says)
    assert api.sql("SELECT count(*) FROM webhooks.subscriptions") == [(0,)]
