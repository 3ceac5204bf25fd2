"""The README sends a newcomer to docs/deliveries.md to "subscribe it as that page shows":
the link leads to a section that shows it, for the receiver that page gives."""

from __future__ import annotations

import re

from tests.unit.test_docs import ROOT, anchors

DELIVERIES = ROOT / "docs" / "deliveries.md"


def section(page: str, anchor: str) -> str:
    """The text of the heading whose anchor is `anchor`, up to the next heading."""
    lines = page.splitlines()
    for at, line in enumerate(lines):
        if m := re.match(r"^(#{1,6})\s+(.*)$", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(2).strip().lower()).replace(" ", "-")
            if slug == anchor:
                rest = lines[at + 1:]
                end = next((i for i, x in enumerate(rest) if re.match(r"^#{1,6}\s", x)),
                           len(rest))
                return "\n".join(rest[:end])
    raise AssertionError(f"no heading #{anchor}")


def test_the_readme_links_to_a_section_that_subscribes_the_receiver() -> None:
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"\[[^\]]*\]\(docs/deliveries\.md(#[^)]*)?\)\s+and\s+subscribe it as "
                     r"that\s+page shows", readme)
    assert said is not None, "the README's cross-reference is gone"
    anchor = (said.group(1) or "").lstrip("#")
    assert anchor, "the link names no section: the page's top shows no subscription"
    page = DELIVERIES.read_text()
    assert anchor in anchors(DELIVERIES)
    shown = section(page, anchor)
    # The receiver of that page, its address, subscribed through the API, and a write.
    port = re.search(r'HTTPServer\(\("127\.0\.0\.1", (\d+)\)', page)
    assert port is not None
    assert "receiver.py" in shown
    assert re.search(r"curl .*-X POST .*/api/v1/webhooks/", shown)
    assert f"http://127.0.0.1:{port.group(1)}/" in shown
    assert ".webhooks-dev-token" in shown
    assert "INSERT INTO invoices" in shown
