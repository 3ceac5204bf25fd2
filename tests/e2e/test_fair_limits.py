"""Bounded answers: a list page stops early at WEBHOOKS_MAX_PAGE_BYTES and its Link still
leads through every subscription once (the defaults of the settings that bound one owner:
tests/unit/test_config.py)."""

from __future__ import annotations

import re

from tests.support.api import api_for

BIG = {"customer": {"nin": [f"customer-{i:03}-" + "x" * 60 for i in range(100)]}}


async def test_a_page_stops_at_its_byte_budget_and_the_link_goes_on(db_url: str) -> None:
    async with api_for(db_url, max_page_bytes=20000) as api:
        ids = []
        for _ in range(7):
            response = await api.request("POST", "/api/v1/webhooks/", json={
                "resource": "invoices", "events": "invoice.create",
                "target": api.receiver.url, "filter": BIG})
            assert response.status_code == 201, response.text
            ids.append(response.json()["id"])
        ids.append((await api.create())["id"])
        seen: list[int] = []
        url = "/api/v1/webhooks/?limit=1000"
        pages = 0
        while url:
            response = await api.request("GET", url)
            assert response.status_code == 200, response.text
            page = response.json()
            assert page, "a page holds at least one subscription"
            # Over the budget only by the row that passed it.
            before_last = len(response.content) - len(
                response.content.decode().rsplit(',{"id"', 1)[-1])
            assert before_last <= 20000, len(response.content)
            seen += [s["id"] for s in page]
            pages += 1
            link = response.headers.get("link")
            if link is None:
                break
            match = re.match(r"<([^>]+)>; rel=\"next\"", link)
            assert match, link
            assert "limit=1000" in match.group(1)
            url = match.group(1)
        assert seen == ids
        assert pages >= 3
        # A page that fits ends without a Link.
        one = await api.request("GET", f"/api/v1/webhooks/?after={ids[-2]}")
        assert [s["id"] for s in one.json()] == ids[-1:] and "link" not in one.headers
