"""Limits that protect the service: body size, subscriptions per owner (race-free), request
rate per token, target length, events per subscription. Each is a clear error that changes
nothing. Their settings: tests/unit/test_config.py; the token bucket:
tests/unit/test_ratelimit.py."""

from __future__ import annotations

import asyncio
import time

from tests.support.api import api_for, assert_error


async def test_body_limit_is_configurable(db_url: str) -> None:
    async with api_for(db_url, max_body_bytes=1000) as api:
        body = {"resource": "invoices", "events": "create", "target": api.receiver.url,
                "x": "y" * 1000}
        assert_error(await api.request("POST", "/api/v1/webhooks", json=body), 413,
                     "larger than 1000 bytes")
        assert api.receiver.received == []
        await api.create()


async def test_subscriptions_per_owner(db_url: str) -> None:
    async with api_for(db_url, max_subscriptions_per_owner=2) as api:
        await api.create()
        await api.create(events="update")
        handshakes = len(api.receiver.received)
        response = await api.request("POST", "/api/v1/webhooks", json={
            "resource": "invoices", "events": "delete", "target": api.receiver.url})
        message = assert_error(response, 400, "WEBHOOKS_MAX_SUBSCRIPTIONS_PER_OWNER")
        assert "2 subscriptions" in message and "delete one" in message
        assert len(api.receiver.received) == handshakes  # the target is not bothered
        # The limit is per owner, whatever the tenant of the token.
        same_owner = api.new_token("alice", tenant="acme")
        response = await api.request("POST", "/api/v1/webhooks", token=same_owner, json={
            "resource": "invoices", "events": "delete", "target": api.receiver.url})
        assert_error(response, 400, "WEBHOOKS_MAX_SUBSCRIPTIONS_PER_OWNER")
        await api.create(token=api.new_token("bob"))
        [first, _] = (await api.request("GET", "/api/v1/webhooks")).json()
        assert (await api.request("DELETE", f"/api/v1/webhooks/{first['id']}")).status_code == 204
        await api.create(events="delete")
        assert api.sql("SELECT owner, count(*) FROM webhooks.subscriptions GROUP BY owner "
                       "ORDER BY owner") == [("alice", 2), ("bob", 1)]


async def test_subscription_limit_holds_under_concurrent_creates(db_url: str) -> None:
    async with api_for(db_url, max_subscriptions_per_owner=3) as api:
        body = {"resource": "invoices", "events": "create", "target": api.receiver.url}
        responses = await asyncio.gather(*(api.request("POST", "/api/v1/webhooks", json=body)
                                           for _ in range(12)))
        codes = sorted(r.status_code for r in responses)
        assert codes == [201] * 3 + [400] * 9, codes
        for response in responses:
            if response.status_code == 400:
                assert_error(response, 400, "WEBHOOKS_MAX_SUBSCRIPTIONS_PER_OWNER")
        assert api.sql("SELECT count(*) FROM webhooks.subscriptions") == [(3,)]


async def test_rate_limit_per_token(db_url: str) -> None:
    async with api_for(db_url, rate_limit=5.0, rate_burst=3) as api:
        for _ in range(3):
            assert (await api.request("GET", "/api/v1/hook_events")).status_code == 200
        limited = await api.request("POST", "/api/v1/webhooks", json={
            "resource": "invoices", "events": "create", "target": api.receiver.url})
        message = assert_error(limited, 429, "WEBHOOKS_RATE_LIMIT")
        assert int(limited.headers["retry-after"]) >= 1
        assert api.token not in message
        assert api.receiver.received == []  # refused before anything happened
        assert api.sql("SELECT count(*) FROM webhooks.subscriptions") == [(0,)]
        # Another token has its own bucket; invalid tokens are 401, not 429.
        other = api.new_token("alice")
        assert (await api.request("GET", "/api/v1/hook_events", token=other)).status_code == 200
        assert_error(await api.request("GET", "/api/v1/hook_events",
                                       token="wht_" + "Z" * 43), 401)
        # The bucket refills: the first token gets through again without waiting long.
        deadline = time.monotonic() + 5
        while (await api.request("GET", "/api/v1/hook_events")).status_code == 429:
            assert time.monotonic() < deadline, "the rate limit never lifted"
            await asyncio.sleep(0.05)


async def test_the_reads_that_check_the_token_in_their_own_statement_are_limited_too(
        db_url: str) -> None:
    # GET one and the list look the token up in the same statement as the subscriptions:
    # the same bucket applies to them (one request every 10 s after a burst of three).
    async with api_for(db_url, rate_limit=0.1, rate_burst=3) as api:
        created = await api.create()
        paths = (f"/api/v1/webhooks/{created['id']}", "/api/v1/webhooks")
        for path in paths:
            assert (await api.request("GET", path)).status_code == 200
        for path in paths:
            assert_error(await api.request("GET", path), 429, "WEBHOOKS_RATE_LIMIT")


async def test_rate_limit_zero_is_off(db_url: str) -> None:
    async with api_for(db_url, rate_limit=0.0, rate_burst=1) as api:
        for _ in range(20):
            assert (await api.request("GET", "/api/v1/hook_events")).status_code == 200


async def test_target_length_limit(db_url: str) -> None:
    async with api_for(db_url, max_target_length=60) as api:
        long = api.receiver.url + "?" + "a" * 60
        response = await api.request("POST", "/api/v1/webhooks", json={
            "resource": "invoices", "events": "create", "target": long})
        assert_error(response, 400, "longer than 60 characters")
        assert api.receiver.received == []
        await api.create()  # the receiver's own URL is short enough


async def test_events_per_subscription_limit(db_url: str) -> None:
    async with api_for(db_url, max_events_per_subscription=2) as api:
        response = await api.request("POST", "/api/v1/webhooks", json={
            "resource": "invoices", "events": "create,update,delete",
            "target": api.receiver.url})
        assert_error(response, 400, "WEBHOOKS_MAX_EVENTS_PER_SUBSCRIPTION")
        assert api.receiver.received == []
        # Duplicates and aliases collapse before counting.
        created = await api.create(events="create, invoice.create, delete, destroy")
        assert created["events"] == "invoice.create,invoice.delete"
