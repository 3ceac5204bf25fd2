"""The dashboard shows a subscription's rate limit and makes subscriptions with one: at
1280 x 800, without sideways scrolling.

With WEBHOOKS_SCREENSHOT_DIR set, the test writes its picture there."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.e2e.test_dashboard import row_of
from tests.e2e.test_dashboard_edges import assert_inside, connected
from tests.support.api import Api
from tests.support.receivers import Receiver


async def test_a_rate_limit_is_shown_and_set_from_the_page(api: Api, browser: Any) -> None:
    from playwright.async_api import expect

    limited = await api.request("POST", "/api/v1/webhooks/", json={
        "resource": "invoices", "events": "invoice.create", "target": api.receiver.url,
        "rate_limit": 25})
    assert limited.status_code == 201, limited.text
    context, page = await connected(api, browser)
    try:
        await expect(row_of(page, api.receiver.url)).to_contain_text("at most 25 per second")
        async with Receiver() as other:
            await page.get_by_text("New subscription").click()
            await page.get_by_label("Resource").select_option("invoices")
            await page.get_by_label("invoice.update").check()
            await page.get_by_label("Target URL").fill(other.url)
            await page.get_by_label("Rate limit (per second)").fill("7")
            await page.get_by_role("button", name="Create subscription").click()
            await expect(row_of(page, other.url)).to_contain_text("at most 7 per second")
        [(rate,)] = api.sql("SELECT rate_limit FROM webhooks.subscriptions WHERE target = %s",
                            other.url)
        assert rate == 7
        await assert_inside(page, "rate limits")
        shots = os.environ.get("WEBHOOKS_SCREENSHOT_DIR")
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(Path(shots) / "rate-limit.png"), full_page=True)
    finally:
        await context.close()
