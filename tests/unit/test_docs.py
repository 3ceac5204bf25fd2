"""The documentation stands alone: every relative link of README.md and docs/ resolves (a
file, and a heading when the link names one), and nothing points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings."""
    found = set()
    for line in page.read_text().splitlines():
        if m := re.match(r"^#{1,6}\s+(.*)$", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
    return found


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in _LINK.findall(page.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_nothing_refers_outside_the_repository() -> None:
    for page in PAGES:
        text = page.read_text()
        assert "../shared" not in text and "SPEC.md" not in text, page.name
        assert not re.search(r"\bSPEC section\b", text), page.name


def test_the_readme_fits_on_a_few_screens() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
