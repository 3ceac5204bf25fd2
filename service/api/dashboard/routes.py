"""GET /dashboard (the page), GET /dashboard/static/<name> (its modules, style and icon)
and GET /favicon.ico (the icon).

The files ship inside the package (package data). Only the names in FILES are served, each
with its media type, `X-Content-Type-Options: nosniff` and a Content-Security-Policy that
allows no inline script, no inline style and nothing from another origin.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Annotated

from litestar import Response, get
from litestar.exceptions import NotFoundException
from litestar.params import Parameter

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; "
       "base-uri 'none'; frame-ancestors 'none'")

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # Revalidated on every load, so an upgrade of the package shows at once.
    "Cache-Control": "no-cache",
}

FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "view.js": "text/javascript; charset=utf-8",
    "payload.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
    "dashboard.css": "text/css; charset=utf-8",
}


@functools.cache
def read(name: str) -> bytes:
    """The bytes of one of the page's files (package data)."""
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _file(name: str) -> Response[bytes]:
    if name not in FILES:
        raise NotFoundException(f"no dashboard file named {name!r}")
    return Response(read(name), media_type=FILES[name], headers=HEADERS)


@get("/dashboard", include_in_schema=False, sync_to_thread=False)
def dashboard() -> Response[bytes]:
    """The page: paste a token, see its owner's subscriptions and deliveries."""
    return _file("index.html")


@get("/dashboard/static/{name:str}", include_in_schema=False, sync_to_thread=False)
def dashboard_file(name: Annotated[str, Parameter(description="file name")]) -> Response[bytes]:
    """One of the page's modules or its style sheet."""
    return _file(name)


@get("/favicon.ico", include_in_schema=False, sync_to_thread=False)
def favicon() -> Response[bytes]:
    """The page's icon, for browsers that ask for it at the root (the API's docs page)."""
    return _file("favicon.svg")


HANDLERS = [dashboard, dashboard_file, favicon]
