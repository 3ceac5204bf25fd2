"""GET /schema (and /schema/swagger): Swagger UI over /schema/openapi.json, its files served
from the package under /schema/static/.

The page shares its origin with the dashboard, whose token lives in sessionStorage: it
loads nothing from another host, and its Content-Security-Policy allows scripts from this
origin only. Swagger UI sets inline styles, so styles allow 'unsafe-inline' here (not on
the dashboard); its bundle is Swagger UI's release as published (swagger-ui-dist, Apache
2.0, see static/swagger-ui.LICENSE.txt).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Annotated, Any

from litestar import Request, Response, Router, get
from litestar.exceptions import NotFoundException
from litestar.openapi.plugins import OpenAPIRenderPlugin
from litestar.params import Parameter

SWAGGER_UI_VERSION = "5.35.0"

CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
       "frame-ancestors 'none'")

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}

FILES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "init.js": "text/javascript; charset=utf-8",
    "swagger-ui.LICENSE.txt": "text/plain; charset=utf-8",
}


@functools.cache
def read(name: str) -> bytes:
    """The bytes of one of the page's files (package data)."""
    return resources.files(__package__).joinpath("static", name).read_bytes()


@get("/static/{name:str}", include_in_schema=False, sync_to_thread=False)
def docs_file(name: Annotated[str, Parameter(description="file name")]) -> Response[bytes]:
    """One of Swagger UI's files; they change only with the package's version."""
    if name not in FILES:
        raise NotFoundException(f"no documentation file named {name!r}")
    return Response(read(name), media_type=FILES[name],
                    headers={**HEADERS, "Cache-Control": "public, max-age=86400"})


class LocalSwaggerPlugin(OpenAPIRenderPlugin):
    """Swagger UI at /schema and /schema/swagger, from the package's files."""

    def __init__(self) -> None:
        super().__init__(path=["/", "/swagger"])

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return read("index.html")

    def receive_router(self, router: Router) -> None:
        router.register(docs_file)


PAGES = {"/schema", "/schema/swagger"}


def page_headers(app: Any) -> Any:
    """ASGI middleware: the Swagger UI page (rendered by Litestar's OpenAPI router) gets the
    same Content-Security-Policy as its files."""
    extra = [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]

    async def middleware(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") not in PAGES:
            await app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await app(scope, receive, send_with_headers)

    return middleware


LINKS = {"dashboard": "/dashboard", "api_docs": "/schema",
         "openapi": "/schema/openapi.json", "api": "/api/v1/webhooks/",
         "health": "/healthz", "ready": "/readyz", "metrics": "/metrics"}

HOME = ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<title>Webhook subscription service</title></head><body>"
        "<h1>Webhook subscription service</h1><ul>"
        "<li><a href=\"/dashboard\">Dashboard</a>: your subscriptions and their deliveries"
        "</li><li><a href=\"/schema\">API documentation</a> "
        "(<a href=\"/schema/openapi.json\">OpenAPI document</a>)</li>"
        "<li>REST API under <code>/api/v1/</code></li></ul></body></html>")


@get("/", include_in_schema=False, sync_to_thread=False)
def home(request: Request[Any, Any, Any]) -> Response[Any]:
    """Where to go from here: the dashboard and the API documentation (HTML for a browser,
    else JSON)."""
    if "text/html" in request.headers.get("accept", ""):
        return Response(HOME, media_type="text/html; charset=utf-8", headers=HEADERS)
    return Response(LINKS)
