"""The REST API refuses an owner's backfill beyond WEBHOOKS_MAX_BACKFILLS_PER_OWNER with a
409 that names the limit, and starts nothing."""

from __future__ import annotations

import pytest

from tests.support.api import Api, assert_error

pytestmark = pytest.mark.api_settings(max_backfills_per_owner=2)


async def test_a_backfill_beyond_the_owners_limit_is_409(api: Api) -> None:
    subs = [await api.create() for _ in range(3)]
    for sub in subs[:2]:
        started = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/backfill", json={})
        assert started.status_code == 202, started.text
    refused = await api.request("POST", f"/api/v1/webhooks/{subs[2]['id']}/backfill", json={})
    assert_error(refused, 409, "WEBHOOKS_MAX_BACKFILLS_PER_OWNER")
    assert api.sql("SELECT count(*) FROM webhooks.backfills") == [(2,)]
