"""The dashboard at a laptop's 1280 x 800 in headless chromium: long targets and failure
texts stay inside the width, every control is legible, a subscription is created from the
page (its handshake refusal shown in words), Recover asks before it queues anything, and the
recover time is entered in UTC like every time shown.

With WEBHOOKS_SCREENSHOT_DIR set, the layout test writes docs/dashboard-1280.png there."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tests.e2e.test_dashboard import DEADLINE_MS, poll_async, row_of
from tests.support.api import Api
from tests.support.receivers import Receiver, status
from tests.support.worker import running_worker

WIDTH, HEIGHT = 1280, 800
LONG_PATH = "/hooks/" + "/".join(f"segment-{i}-of-a-rather-long-integration-path" for i in range(8))
LONG_FAILURE = "upstream said: " + "x" * 400
ALL_INVOICE_EVENTS = "invoice.create,invoice.update,invoice.delete,invoice.truncate"


async def connected(api: Api, browser: Any) -> tuple[Any, Any]:
    """A 1280 x 800 page connected with the API's token; (context, page)."""
    from playwright.async_api import expect

    expect.set_options(timeout=DEADLINE_MS)
    context = await browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = await context.new_page()
    await page.goto(f"{api.url}/dashboard")
    await page.get_by_label("API token").fill(api.token)
    await page.get_by_role("button", name="Connect", exact=True).click()
    await expect(page.get_by_role("status")).to_contain_text("Connected")
    return context, page


async def assert_inside(page: Any, what: str) -> None:
    """No sideways scrolling and every Delete button within the viewport."""
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= WIDTH, f"{what}: the page scrolls sideways ({width} px)"
    deletes = page.get_by_role("button", name="Delete", exact=True)
    assert await deletes.count() > 0
    for i in range(await deletes.count()):
        box = await deletes.nth(i).bounding_box()
        assert box is not None and box["x"] + box["width"] <= WIDTH, (what, i, box)
    overflowing = await page.evaluate(
        "[...document.querySelectorAll('section')]"
        ".filter(s => s.scrollWidth > s.clientWidth).map(s => s.id)")
    assert overflowing == [], f"{what}: sections scroll sideways: {overflowing}"


async def test_long_targets_and_logs_fit_1280_pixels(api: Api, browser: Any) -> None:
    from playwright.async_api import expect

    first = await api.create()
    second = await api.create(events=ALL_INVOICE_EVENTS, target=api.receiver.url + "/second")
    long_target = api.receiver.url + LONG_PATH
    api.sql("UPDATE webhooks.subscriptions SET target = %s, last_failure_content = %s,"
            " last_failure_at = now(), last_status = 503 WHERE id = %s",
            long_target, LONG_FAILURE, first["id"])
    for _ in range(3):
        sent = await api.request("POST", f"/api/v1/webhooks/{first['id']}/test")
        assert sent.status_code in (200, 201, 202), sent.text
    context, page = await connected(api, browser)
    row = row_of(page, "segment-0")
    await expect(row).to_have_count(1)
    await expect(row_of(page, "/second")).to_have_count(1)
    # The whole target is on hover, even where the cell wraps it.
    assert await row.locator("td.target").get_attribute("title") == long_target
    await assert_inside(page, "subscriptions")
    await page.screenshot(path="/tmp/dash-list.png", full_page=True)

    await row.get_by_role("button", name="Deliveries", exact=True).click()
    await expect(page.locator("#delivery-rows tr")).to_have_count(3)
    await assert_inside(page, "delivery log")
    directory = os.environ.get("WEBHOOKS_SCREENSHOT_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        await page.evaluate("window.scrollTo(0, 0)")
        await page.screenshot(path=str(Path(directory) / "dashboard-1280.png"))
    await page.locator("#delivery-rows tr").first.get_by_role("button", name="Details").click()
    await expect(page.locator("#payload")).to_contain_text("webhook.test")
    await assert_inside(page, "delivery")
    await page.screenshot(path="/tmp/dash-log.png", full_page=True)
    assert second["id"] != first["id"]
    await context.close()


async def test_connect_stays_legible_on_hover(api: Api, browser: Any) -> None:
    context = await browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = await context.new_page()
    await page.goto(f"{api.url}/dashboard")
    connect = page.get_by_role("button", name="Connect", exact=True)
    await connect.hover()
    colours = await connect.evaluate(
        "b => { const s = getComputedStyle(b); return [s.color, s.backgroundColor]; }")
    assert colours[0] != colours[1], f"the label has the background's colour: {colours}"
    await context.close()


async def test_a_subscription_is_created_from_the_page(api: Api, browser: Any) -> None:
    from playwright.async_api import expect

    await api.create()
    context, page = await connected(api, browser)
    await page.get_by_text("New subscription", exact=True).click()
    await page.get_by_label("Resource").select_option("invoices")
    await page.get_by_label("invoice.update", exact=True).check()
    await page.get_by_label("invoice.delete", exact=True).check()
    target = api.receiver.url + "/from-the-page"
    await page.get_by_label("Target URL").fill(target)
    await page.get_by_role("button", name="Create subscription").click()
    await expect(page.get_by_role("status")).to_contain_text("created")
    await expect(row_of(page, "/from-the-page")).to_have_count(1)
    rows = api.sql("SELECT resource, target FROM webhooks.subscriptions WHERE target = %s",
                   target)
    assert rows == [("invoices", target)]
    created = (await api.request("GET", "/api/v1/webhooks/")).json()
    events = [w["events"] for w in created if w["target"] == target]
    assert len(events) == 1 and "invoice.update" in str(events[0]) \
        and "invoice.delete" in str(events[0]), events

    # A target that refuses the handshake: the API's words beside the form; nothing made.
    async with Receiver(behaviour=status(503)) as refusing:
        await page.get_by_label("invoice.create", exact=True).check()
        await page.get_by_label("Target URL").fill(refusing.url)
        await page.get_by_role("button", name="Create subscription").click()
        await expect(page.locator("#create-error")).to_contain_text(
            "target verification failed")
        await expect(page.locator("#create-error")).to_be_visible()
    assert api.sql("SELECT count(*) FROM webhooks.subscriptions WHERE target = %s",
                   refusing.url) == [(0,)]
    await page.screenshot(path="/tmp/dash-create.png", full_page=True)
    await context.close()


async def test_recover_asks_before_queueing(api: Api, browser: Any) -> None:
    from playwright.async_api import expect

    sub = await api.create()
    context, page = await connected(api, browser)
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    await row_of(page, api.receiver.url).get_by_role("button", name="Deliveries").click()
    since = page.get_by_label("Failed since (UTC)")
    assert await since.get_attribute("type") == "text"
    await since.fill("2026-02-31 10:00")
    await page.get_by_role("button", name="Recover", exact=True).click()
    await expect(page.get_by_role("alert")).to_contain_text("YYYY-MM-DD HH:MM (UTC)")
    await since.fill("2020-01-02 03:04")
    await page.get_by_role("button", name="Recover", exact=True).click()
    await expect(page.get_by_role("status")).to_contain_text("2020-01-02 03:04:00 UTC")
    await page.get_by_role("button", name="Cancel", exact=True).click()
    await expect(page.get_by_role("status")).to_contain_text("Nothing queued")
    assert not [u for u in posts if u.endswith("/recover")]

    await page.get_by_role("button", name="Recover", exact=True).click()
    await page.get_by_role("button", name="Confirm recover", exact=True).click()
    await expect(page.get_by_role("status")).to_contain_text("0 failed deliveries since "
                                                             "2020-01-02 03:04:00 UTC")
    assert [u for u in posts if u.endswith("/recover")] == [
        f"{api.url}/api/v1/webhooks/{sub['id']}/recover"]
    await page.screenshot(path="/tmp/dash-recover.png", full_page=True)
    await context.close()


async def test_paused_by_the_owner_is_not_disabled_by_the_service(api: Api, browser: Any) -> None:
    from playwright.async_api import expect

    paused = await api.create()
    stopped = await api.create(target=api.receiver.url + "/stopped")
    answer = await api.request("PUT", f"/api/v1/webhooks/{paused['id']}/", json={"active": False})
    assert answer.status_code == 200, answer.text
    api.sql("UPDATE webhooks.subscriptions SET active = false, inactive_reason = %s,"
            " last_failure_at = now(), last_status = 503 WHERE id = %s",
            "disabled after failing for 3 days", stopped["id"])
    context, page = await connected(api, browser)
    owner = page.locator(f'#subscription-rows tr[data-subscription="{paused["id"]}"]')
    service = row_of(page, "/stopped")
    await expect(owner.get_by_text("paused", exact=True)).to_be_visible()
    await expect(owner.get_by_text("disabled", exact=True)).to_have_count(0)
    await expect(service.get_by_text("disabled", exact=True)).to_be_visible()
    await expect(service.get_by_text("paused", exact=True)).to_have_count(0)
    await expect(service).to_contain_text("disabled after failing for 3 days")
    # The last attempt failed: not yet webhook.failing, which waits for failing_after.
    recent = service.get_by_text("recent failures", exact=True)
    await expect(recent).to_be_visible()
    assert "webhook.failing" in (await recent.get_attribute("title") or "")
    await context.close()


async def test_a_chart_of_the_subscriptions_delivery_outcomes(api: Api, browser: Any) -> None:
    from playwright.async_api import expect

    from tests.support.worker import running_worker

    sub = await api.create()
    async with running_worker(api.db_url):
        sent = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/test")
        assert sent.status_code in (200, 201, 202), sent.text
        await api.receiver.wait_for(
            lambda r: any(b"webhook.test" in d.body for d in r.deliveries()))

        async def delivered() -> bool:
            return api.sql("SELECT status FROM webhooks.deliveries WHERE subscription_id = %s",
                           sub["id"]) == [("succeeded",)]
        await poll_async(delivered, "the test event succeeded")
    for _ in range(2):  # no worker now: these stay pending
        sent = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/test")
        assert sent.status_code in (200, 201, 202), sent.text
    context, page = await connected(api, browser)
    await row_of(page, api.receiver.url).get_by_role("button", name="Deliveries").click()
    chart = page.get_by_role("img", name=re.compile(f"Deliveries of subscription {sub['id']}"))
    await expect(chart).to_be_visible()
    name = await chart.get_attribute("aria-label") or ""
    assert "1 succeeded, 0 failed, 2 pending" in name, name
    assert await chart.locator("rect.succeeded").count() == 1
    assert await chart.locator("rect.pending").count() == 1
    await assert_inside(page, "chart")
    await page.screenshot(path="/tmp/dash-chart.png", full_page=True)
    await context.close()


async def test_a_strict_queue_shows_what_waits_behind_its_first_delivery(
        api: Api, browser: Any) -> None:
    """A strict subscription whose first delivery fails: the log says the later ones wait
    behind it, where an unordered delivery shows its next attempt's time."""
    from playwright.async_api import expect

    async with Receiver() as target:
        response = await api.request("POST", "/api/v1/webhooks/", json={
            "resource": "invoices", "events": "invoice.create", "target": target.url,
            "ordering": "strict"})
        assert response.status_code == 201, response.text
        sid = response.json()["id"]
        target.behaviour = status(503)
        async with running_worker(api.db_url, retry_schedule=(30.0, 30.0)):
            api.sql("INSERT INTO invoices (number, customer, amount)"
                    " SELECT 'Q-' || i, 'c', 1 FROM generate_series(1, 3) i")

            async def held() -> bool:
                rows = api.sql("SELECT attempts FROM webhooks.deliveries"
                               " WHERE subscription_id = %s AND status = 'pending'"
                               " ORDER BY id", sid)
                return len(rows) == 3 and rows[0][0] >= 1
            await poll_async(held, "three queued behind a tried first delivery")
            context, page = await connected(api, browser)
            await row_of(page, target.url).get_by_role(
                "button", name="Deliveries", exact=True).click()
            log = page.locator("#delivery-rows tr")
            await expect(log).to_have_count(3)
            await expect(log.filter(has_text="behind an earlier one")).to_have_count(2)
            # Newest first: the last row is the first delivery, its retry's time shown.
            await expect(log.last).not_to_contain_text("behind an earlier one")
            await expect(log.last).to_contain_text("UTC")
            await log.first.get_by_role("button", name="Details").click()
            await expect(page.locator("#delivery-fields")).to_contain_text(
                "behind an earlier one")
            shots = os.environ.get("WEBHOOKS_SCREENSHOT_DIR")
            if shots:
                await page.screenshot(path=str(Path(shots) / "strict-queue.png"),
                                      full_page=True)
            await context.close()


async def test_an_earlier_refresh_answered_late_does_not_bring_back_a_deleted_row(
        api: Api, browser: Any) -> None:
    """A follow-up's refresh of the list, sent before a deletion and answered after the
    deletion's own refresh, is not shown: only the latest load of a list is."""
    from playwright.async_api import expect

    gone = await api.create(target=api.receiver.url + "/gone")
    await api.create(target=api.receiver.url + "/kept")
    context, page = await connected(api, browser)
    kept, deleted = row_of(page, "/kept"), row_of(page, "/gone")
    await expect(deleted).to_have_count(1)

    held: list[tuple[Any, Any]] = []  # the refresh fetched before the deletion, unanswered
    later: list[Any] = []             # refreshes after it was answered, never answered
    phase = {"holding": True, "answered": False}

    async def lists(route: Any) -> None:
        if route.request.method != "GET":
            await route.continue_()
        elif phase["holding"]:
            phase["holding"] = False
            held.append((route, await route.fetch()))
        elif phase["answered"]:
            later.append(route)
        else:
            await route.continue_()

    await page.route(re.compile(r"/api/v1/webhooks/\?limit="), lists)
    # Send test event refreshes the list a second later (its follow-up): that refresh is
    # fetched now, with the subscription still there, and held.
    await kept.get_by_role("button", name="Send test event").click()
    await poll_async(lambda: _true(held), "the follow-up's refresh held")
    page.once("dialog", lambda dialog: dialog.accept())
    await deleted.get_by_role("button", name="Delete").click()
    await expect(page.get_by_role("status")).to_contain_text(f"Subscription {gone['id']} deleted")
    await expect(deleted).to_have_count(0)
    # The held refresh is answered now; the follow-up's next refresh comes once it has
    # been handled, and waits unanswered: the list is what that old answer left.
    route, response = held[0]
    phase["answered"] = True
    await route.fulfill(response=response)
    await poll_async(lambda: _true(later), "the follow-up's next refresh", timeout=30)
    assert await deleted.count() == 0, "an older answer brought the deleted row back"
    assert await kept.count() == 1
    await context.close()


async def _true(items: list[Any]) -> bool:
    return bool(items)
