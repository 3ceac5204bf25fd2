"""HEAD on every GET route answers as GET does, without the body (RFC 9110, 9.3.2):
health checks and uptime monitors probe with HEAD.

Litestar routes HEAD only to handlers declared for it; this wraps the app's ASGI handler,
routes a HEAD request as a GET and sends the GET's status and headers (its Content-Length
included) with an empty body. The request's scope keeps HEAD_MARK, so that a 405 names the
method the client sent (errors.py).
"""

from __future__ import annotations

from typing import Any

from litestar.types import ASGIApp, Message, Receive, Scope, Send

HEAD_MARK = "webhooks.head"


def head_as_get(app: ASGIApp) -> ASGIApp:
    """`app`, answering HEAD as GET without the body."""

    async def handler(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await app(scope, receive, send)
            return
        as_get: Any = {**scope, "method": "GET", HEAD_MARK: True}
        finished = False

        async def bodiless(message: Message) -> None:
            nonlocal finished
            if message["type"] == "http.response.body":
                if finished or message.get("more_body", False):
                    return  # the body's chunks are left out; the last one ends the response
                finished = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await app(as_get, receive, bodiless)

    return handler


def allowed(allow: str) -> str:
    """An Allow header's methods with HEAD wherever GET is."""
    methods = [m.strip() for m in allow.split(",") if m.strip()]
    if "GET" in methods and "HEAD" not in methods:
        methods.insert(methods.index("GET") + 1, "HEAD")
    return ", ".join(methods)
