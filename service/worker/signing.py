"""Signing of deliveries: Standard Webhooks headers and the REST Hooks X-Hook-Signature."""

from __future__ import annotations

import base64
import hashlib
import hmac
from functools import lru_cache

SECRET_PREFIX = "whsec_"


def message_id(delivery_id: int) -> str:
    """The webhook-id of a delivery: the same on every retry, so receivers can de-duplicate."""
    return f"msg_{delivery_id}"


@lru_cache(maxsize=4096)
def standard_key(secret: str) -> bytes:
    """The HMAC key of the Standard Webhooks signature: the base64 part of `whsec_...`."""
    encoded = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
    return base64.b64decode(encoded)


@lru_cache(maxsize=4096)
def _keyed(key: bytes) -> hmac.HMAC:
    """An HMAC-SHA256 keyed with `key` and fed nothing yet, copied for each message: the
    key's set-up is done once per secret, not once per signature."""
    return hmac.new(key, digestmod=hashlib.sha256)


def _hmac(key: bytes, message: bytes) -> bytes:
    mac = _keyed(key).copy()
    mac.update(message)
    return mac.digest()


def standard_signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, as Standard Webhooks verifies."""
    signed = b"%s.%d.%s" % (msg_id.encode(), timestamp, body)
    digest = _hmac(standard_key(secret), signed)
    return "v1," + base64.b64encode(digest).decode()


def hook_signature(secret: str, body: bytes) -> str:
    """Hex HMAC-SHA256 of the body keyed with the whole secret string (X-Hook-Signature)."""
    return _hmac(secret.encode(), body).hex()


def signed_headers(secret: str, msg_id: str, timestamp: int, body: bytes,
                   previous: str | None = None) -> dict[str, str]:
    """Every header that identifies and signs one attempt of a delivery.

    During a rotation's overlap `previous` (the secret before it) signs too: the Standard
    Webhooks header carries both signatures, new first, space-separated, so a receiver
    holding either secret verifies; X-Hook-Signature has room for one, the new secret's.
    """
    signature = standard_signature(secret, msg_id, timestamp, body)
    if previous is not None and previous != secret:
        signature += " " + standard_signature(previous, msg_id, timestamp, body)
    return {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
        "X-Hook-Signature": hook_signature(secret, body),
    }
