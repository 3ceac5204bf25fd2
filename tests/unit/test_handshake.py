"""The verification handshake where no target answers: the secret's form, and the SSRF
guard refusing a private target when the client connects (against real receivers on
127.0.0.1: tests/e2e/test_handshake.py)."""

from __future__ import annotations

import base64

from service.api.handshake import new_secret
from service.http import make_client
from tests.support.clients import handshake_failure as failure


def test_secret_form() -> None:
    secrets = {new_secret() for _ in range(50)}
    assert len(secrets) == 50
    for secret in secrets:
        assert secret.startswith("whsec_")
        assert len(base64.b64decode(secret[6:], validate=True)) == 32


async def test_guard_refuses_at_connect_time() -> None:
    guarded = make_client(allow_private=False, timeout=0.5)
    try:
        for url in ("http://127.0.0.1:9/", "http://localhost:9/", "http://[::1]:9/"):
            message = await failure(guarded, url)
            assert "loopback" in message, message
    finally:
        await guarded.aclose()
