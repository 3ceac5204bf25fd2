"""The interactive API documentation: Swagger UI served from the package under a strict
policy, loading nothing from another host; GET / points to the dashboard and the docs."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from tests.support.api import Api


async def test_the_docs_and_their_files_come_from_this_origin(api: Api) -> None:
    for path in ("/schema", "/schema/swagger"):
        page = await api.http.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self';" in page.headers["content-security-policy"]
        assert "http://" not in page.text and "https://" not in page.text
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "init.js"):
        response = await api.http.get(f"/schema/static/{name}")
        assert response.status_code == 200, name
        assert response.headers["x-content-type-options"] == "nosniff"
    assert (await api.http.get("/schema/static/../app.py")).status_code == 404
    assert (await api.http.get("/schema/static/other.js")).status_code == 404


async def test_the_root_points_to_the_dashboard_and_the_docs(api: Api) -> None:
    links = (await api.http.get("/")).json()
    assert links["dashboard"] == "/dashboard" and links["api_docs"] == "/schema"
    page = await api.http.get("/", headers={"Accept": "text/html"})
    assert 'href="/dashboard"' in page.text and 'href="/schema"' in page.text


async def test_the_docs_render_in_a_browser_offline(api: Api, browser: Any) -> None:
    from playwright.async_api import expect

    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    elsewhere: list[str] = []
    page.on("request", lambda r: elsewhere.append(r.url)
            if urlsplit(r.url).netloc != urlsplit(api.url).netloc else None)
    blocked: list[str] = []
    page.on("console", lambda m: blocked.append(m.text)
            if "Content Security Policy" in m.text else None)
    await page.goto(f"{api.url}/schema")
    # The operations of the document are listed, rendered by the page's own scripts.
    await expect(page.get_by_text("/api/v1/webhooks/{webhook_id}/backfill").first).to_be_visible(
        timeout=15_000)
    await page.get_by_role("button", name="Authorize").first.wait_for()
    if target := os.environ.get("WEBHOOKS_SCREENSHOT_DOCS"):
        await page.screenshot(path=target)
    await context.close()
    assert elsewhere == []
    assert blocked == []
