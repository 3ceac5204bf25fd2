"""Headless Debian chromium under Playwright, pointed at the installed binary (nothing
downloads a browser). Without chromium or playwright the browser tests are skipped, saying
what to install."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """A launched headless chromium; closed at the end of the test."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("the browser tests need Debian's chromium: "
                    "apt-get install chromium (make install does it as root)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.skip("the browser tests need playwright: pip install -e '.[test]'")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable)
        try:
            yield launched
        finally:
            await launched.close()
