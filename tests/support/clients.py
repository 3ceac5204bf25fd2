"""The HTTP clients' test helpers, for the unit tests (no server) and the end-to-end ones
(real receivers on 127.0.0.1): the worker's libcurl client, and the handshake's refusals."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from service.api.handshake import HandshakeFailed, new_secret, verify
from service.curl import CurlClient

# A handshake's timeout where the target answers: long enough for a receiver in this
# process under a loaded suite; the tests of timeouts give their own short ones.
ANSWERED = 5.0


@asynccontextmanager
async def curl_client(**kwargs: object) -> AsyncIterator[CurlClient]:
    """The worker's client towards 127.0.0.1 (private targets allowed), closed after."""
    options: dict[str, object] = {"allow_private": True, "max_connections": 8,
                                  "body_limit": 1024}
    options.update(kwargs)
    curl = CurlClient(**options)  # type: ignore[arg-type]
    try:
        yield curl
    finally:
        await curl.close()


async def handshake_failure(client: httpx.AsyncClient, url: str, secret: str | None = None,
                            timeout: float = ANSWERED) -> str:
    """The message of a handshake to `url` that must fail; it never shows the secret."""
    secret = secret or new_secret()
    with pytest.raises(HandshakeFailed) as info:
        await verify(client, url, secret, timeout)
    message = str(info.value)
    assert secret not in message and "whsec_" not in message
    return message
