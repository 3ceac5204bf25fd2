"""The dashboard in a real headless Chromium: Debian's `chromium`, driven by
Playwright pointed at the installed binary (nothing downloads a browser). A real API, worker
and receivers; the page is driven by the accessible names the page promises.

Without chromium (or the playwright package) the browser tests are skipped, saying what to
install. With WEBHOOKS_SCREENSHOT=docs/dashboard.png the test writes the README's picture."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.support.api import Api
from tests.support.receivers import Receiver, echo_secret, status
from tests.support.worker import add_invoice, running_worker

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; "
       "base-uri 'none'; frame-ancestors 'none'")
HOSTILE = '<img src=x onerror="document.title=\'pwned\'">'
DEADLINE_MS = 15_000


async def test_the_page_and_its_files_are_served_with_a_strict_policy(api: Api) -> None:
    for path, media in (("/dashboard", "text/html"),
                        ("/dashboard/static/app.js", "text/javascript"),
                        ("/dashboard/static/api.js", "text/javascript"),
                        ("/dashboard/static/view.js", "text/javascript"),
                        ("/dashboard/static/dashboard.css", "text/css")):
        response = await api.http.get(path)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["content-type"].startswith(media)
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
    page = (await api.http.get("/dashboard")).text
    assert not re.search(r"<script(?![^>]*\bsrc=)", page)  # no inline script
    assert not re.search(r"\son[a-z]+\s*=", page)  # no inline handlers
    assert "http://" not in page and "https://" not in page  # nothing from elsewhere
    missing = await api.http.get("/dashboard/static/secrets.txt")
    assert missing.status_code == 404 and "error" in missing.json()
    schema = (await api.http.get("/schema/openapi.json")).json()
    assert not any(p.startswith("/dashboard") for p in schema["paths"])


# --- in the browser ----------------------------------------------------------------------

def row_of(page: Any, target: str) -> Any:
    """The subscriptions table row of the subscription with this target."""
    return page.locator("#subscription-rows tr").filter(has_text=target)


async def test_the_dashboard_in_a_browser(api: Api, browser: Any) -> None:
    from playwright.async_api import expect

    expect.set_options(timeout=DEADLINE_MS)
    healthy = await api.create()
    async with Receiver() as failing_receiver:
        failing = await api.create(target=failing_receiver.url)
        failing_receiver.behaviour = status(503, body=HOSTILE)
        await run_the_page(api, browser, healthy, failing, failing_receiver)


async def run_the_page(api: Api, browser: Any, healthy: dict[str, Any],
                       failing: dict[str, Any], failing_receiver: Receiver) -> None:
    from playwright.async_api import expect

    async with running_worker(api.db_url):
        with psycopg.connect(api.db_url, autocommit=True) as conn:
            add_invoice(conn, "INV-DASH-1")
        await api.receiver.wait_for(lambda r: len(r.deliveries()) >= 1)
        await failing_receiver.wait_for(lambda r: len(r.deliveries()) >= 1)

        async def failed() -> bool:
            rows = api.sql("SELECT status FROM webhooks.deliveries WHERE subscription_id = %s",
                           failing["id"])
            return bool(rows) and all(r[0] == "failed" for r in rows)
        await poll_async(failed, "the failing subscription's delivery failed")
        # What the target answered, hostile: it must show as text.
        api.sql("UPDATE webhooks.subscriptions SET last_failure_content = %s WHERE id = %s",
                HOSTILE, failing["id"])

        context = await browser.new_context(viewport={"width": 1500, "height": 900})
        page = await context.new_page()
        urls: list[str] = []
        page.on("request", lambda request: urls.append(request.url))
        dialogs: list[str] = []

        # Load; a wrong token is refused in words.
        response = await page.goto(f"{api.url}/dashboard")
        assert response is not None and response.headers["content-security-policy"] == CSP
        await page.get_by_label("API token").fill("not-a-token")
        await page.get_by_role("button", name="Connect", exact=True).click()
        await expect(page.get_by_role("alert")).to_contain_text("token was not accepted")

        # Paste the token, Connect: the owner's subscriptions with their health.
        await page.get_by_label("API token").fill(api.token)
        await page.get_by_role("button", name="Connect", exact=True).click()
        bad = row_of(page, failing_receiver.url)
        good = row_of(page, api.receiver.url)
        await expect(bad.get_by_text("recent failures", exact=True)).to_be_visible()
        await expect(bad).to_contain_text("503")
        await expect(good.get_by_text("healthy", exact=True)).to_be_visible()
        await expect(good.get_by_text("recent failures", exact=True)).to_have_count(0)
        # The hostile failure content is text; no element came of it.
        await expect(bad.get_by_text(HOSTILE, exact=True)).to_be_visible()
        assert await page.locator("img").count() == 0
        assert await page.title() == "Webhooks dashboard"
        assert await page.evaluate("sessionStorage.length") == 1

        # The failing subscription's log: newest first, filterable, a delivery's attempts.
        await bad.get_by_role("button", name="Deliveries", exact=True).click()
        log = page.locator("#delivery-rows tr")
        await expect(log).to_have_count(1)
        await expect(log.first).to_contain_text("failed")
        await page.get_by_label("Status").select_option("succeeded")
        await expect(page.get_by_text("No deliveries match.")).to_be_visible()
        await page.get_by_label("Status").select_option("failed")
        await expect(log).to_have_count(1)
        await log.first.get_by_role("button", name="Details").click()
        await expect(page.locator("#attempt-rows tr").first).to_contain_text("503")
        await expect(page.locator("#payload")).to_contain_text("INV-DASH-1")
        screenshot = os.environ.get("WEBHOOKS_SCREENSHOT")
        if screenshot:
            Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=screenshot, full_page=True)

        # Redeliver, now that the target answers: it succeeds and the page shows it.
        await page.get_by_label("Status").select_option("")
        failing_receiver.behaviour = echo_secret
        await log.first.get_by_role("button", name="Redeliver", exact=True).click()
        await expect(page.get_by_role("status")).to_contain_text("queued again")
        await expect(log.first).to_contain_text("succeeded")
        await expect(bad.get_by_text("recent failures", exact=True)).to_have_count(0)
        assert len(failing_receiver.deliveries()) >= 2

        # Pause and Resume.
        await bad.get_by_role("button", name="Pause", exact=True).click()
        await expect(bad.get_by_text("paused", exact=True)).to_be_visible()
        assert api.sql("SELECT active FROM webhooks.subscriptions WHERE id = %s",
                       failing["id"]) == [(False,)]
        await bad.get_by_role("button", name="Send test event").click()
        await expect(page.get_by_role("alert")).to_contain_text("409")
        await bad.get_by_role("button", name="Resume", exact=True).click()
        await expect(bad.get_by_text("paused", exact=True)).to_have_count(0)
        await expect(bad.get_by_role("button", name="Pause", exact=True)).to_be_visible()
        assert api.sql("SELECT active FROM webhooks.subscriptions WHERE id = %s",
                       failing["id"]) == [(True,)]

        # Recover: a test event fails while the target is down; once it is up again,
        # Recover (failed since a day ago, the default) sends it again.
        failing_receiver.behaviour = status(503, body="down for maintenance")
        await bad.get_by_role("button", name="Send test event").click()
        await expect(page.get_by_role("status")).to_contain_text("Test event queued")
        await expect(log.first).to_contain_text("webhook.test")
        await expect(log.first).to_contain_text("failed")
        failing_receiver.behaviour = echo_secret
        await page.get_by_role("button", name="Recover", exact=True).click()
        await page.get_by_role("button", name="Confirm recover", exact=True).click()
        await expect(page.get_by_role("status")).to_contain_text("1 failed delivery")
        await expect(log.first).to_contain_text("succeeded")

        # Send test event, Rotate secret against the real receiver (it echoes X-Hook-Secret).
        await good.get_by_role("button", name="Send test event").click()
        await expect(page.get_by_role("status")).to_contain_text("Test event queued")
        await api.receiver.wait_for(
            lambda r: any(b"webhook.test" in d.body for d in r.deliveries()))
        handshakes = [r for r in api.receiver.received if "x-hook-secret" in r.headers]
        await good.get_by_role("button", name="Rotate secret").click()
        await expect(page.get_by_role("status")).to_contain_text("rotated")
        after = [r for r in api.receiver.received if "x-hook-secret" in r.headers]
        assert len(after) == len(handshakes) + 1
        assert after[-1].headers["x-hook-secret"] != handshakes[-1].headers["x-hook-secret"]

        # Backfill: every current row as a snapshot, its progress in the notice line.
        await good.get_by_role("button", name="Backfill", exact=True).click()
        await expect(page.get_by_role("status")).to_contain_text("done: 1 row queued")
        await good.get_by_role("button", name="Deliveries", exact=True).click()
        await expect(page.locator("#log-backfill")).to_contain_text("done, 1 row queued")
        await expect(log.filter(has_text="invoice.snapshot")).to_have_count(1)
        await api.receiver.wait_for(
            lambda r: any(b"invoice.snapshot" in d.body for d in r.deliveries()))

        # Delete asks first: dismissed, nothing happens; accepted, the subscription goes.
        async def answer(dialog: Any, accept: bool) -> None:
            dialogs.append(dialog.message)
            await (dialog.accept() if accept else dialog.dismiss())
        page.once("dialog", lambda d: answer(d, False))
        await good.get_by_role("button", name="Delete").click()
        await expect(page.get_by_role("status")).to_contain_text("Nothing deleted")
        assert (await api.request("GET", f"/api/v1/webhooks/{healthy['id']}")).status_code == 200
        page.once("dialog", lambda d: answer(d, True))
        await good.get_by_role("button", name="Delete").click()
        await expect(good).to_have_count(0)
        assert (await api.request("GET", f"/api/v1/webhooks/{healthy['id']}")).status_code == 404
        assert len(dialogs) == 2 and f"subscription {healthy['id']}" in dialogs[0]

        # The token never went into a URL; nothing was fetched from elsewhere.
        assert urls and not any(api.token in url for url in urls)
        assert all(url.startswith(api.url) for url in urls), urls
        assert await page.locator("img").count() == 0
        await context.close()


async def poll_async(predicate: Any, what: str, timeout: float = 15.0) -> None:
    """Waits until the async `predicate()` holds; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout}s"
        await asyncio.sleep(0.05)
