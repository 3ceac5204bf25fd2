"""The dashboard shows a delivery's payload exactly as it was sent (`1.00` stays `1.00`,
as the API returns it), indented on request without changing a token, and the page has an
icon: no request of the page fails, nothing in the console.

With WEBHOOKS_SCREENSHOT_DIR set, the test writes its picture there."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import psycopg

from tests.db.test_cli_deliveries import seed
from tests.e2e.test_dashboard import row_of
from tests.e2e.test_dashboard_edges import connected
from tests.support.api import Api

# Numbers JSON.parse would change (1.00 -> 1, 0.10 -> 0.1, -0.0 -> 0; PostgreSQL keeps
# them, as 1.00, 0.10 and 0.0), a string with quotes, braces and a backslash, and an empty
# object and array.
BODY = ('{"event": {"name": "invoice.create"}, "resource": {"amount": 1.00, "rate": 0.10, '
        '"big": 1E+2, "zero": -0.0, "note": "say \\"hi\\" {not: [json]} \\\\ ok", '
        '"tags": [], "meta": {}}}')


async def test_the_payload_is_shown_as_sent_and_the_page_has_an_icon(
        api: Api, browser: Any) -> None:
    from playwright.async_api import expect

    sub = await api.create()
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        delivery = seed(conn, sub["id"], "succeeded", "2026-01-05T10:00:00Z")
        conn.execute("UPDATE webhooks.events SET body = %s::jsonb WHERE id = (SELECT event_id"
                     " FROM webhooks.deliveries WHERE id = %s)", (BODY, delivery))
    # What the API returns for it: the payload's text as the receiver got it.
    detail = await api.request("GET", f"/api/v1/webhooks/{sub['id']}/deliveries/{delivery}")
    assert detail.status_code == 200, detail.text
    sent = msgspec.json.decode(detail.content, type=dict[str, msgspec.Raw])["payload"]
    sent_text = bytes(sent).decode()
    assert '"amount": 1.00' in sent_text

    context, page = await connected(api, browser)
    failed: list[str] = []
    console: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400
            else None)
    page.on("requestfailed", lambda r: failed.append(f"failed {r.url}"))
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    try:
        await page.reload()
        await page.get_by_label("API token").fill(api.token)
        await page.get_by_role("button", name="Connect", exact=True).click()
        await row_of(page, api.receiver.url).get_by_role(
            "button", name="Deliveries", exact=True).click()
        await page.locator("#delivery-rows tr").first.get_by_role(
            "button", name="Details").click()
        payload = page.locator("#payload")
        await expect(payload).to_contain_text('"amount": 1.00')
        shown = await payload.text_content()
        assert shown is not None
        assert shown == sent_text
        for literal in ('"amount": 1.00', '"rate": 0.10', '"zero": 0.0',
                        '\\"hi\\" {not: [json]} \\\\ ok'):
            assert literal in shown, literal

        # Indented: only whitespace between tokens changes; back as sent.
        await page.get_by_label("Indented").check()
        await expect(payload).to_contain_text('\n    "rate": 0.10,\n')
        indented = await payload.text_content()
        assert indented is not None and "".join(indented.split()) == "".join(shown.split())
        assert '"tags": []' in indented and '"meta": {}' in indented
        screenshots = os.environ.get("WEBHOOKS_SCREENSHOT_DIR")
        if screenshots:
            await page.locator("#delivery").screenshot(
                path=str(Path(screenshots) / "dashboard-payload.png"))
        await page.get_by_label("Indented").uncheck()
        await expect(payload).to_have_text(shown)
        if screenshots:
            await page.locator("#delivery").screenshot(
                path=str(Path(screenshots) / "dashboard-payload-as-sent.png"))

        # The icon: declared by the page, served, and asked for at the root too.
        icon = await page.evaluate("document.querySelector('link[rel=icon]').href")
        response = await api.http.get(icon)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("image/svg+xml")
        assert response.content.startswith(b"<svg")
        root = await api.http.get("/favicon.ico")
        assert root.status_code == 200 and root.content == response.content
    finally:
        await context.close()
    assert failed == [], failed
    assert console == [], console
