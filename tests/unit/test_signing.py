"""Signing: Standard Webhooks and X-Hook-Signature, checked against independent verifiers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from service.worker.signing import (
    hook_signature,
    message_id,
    signed_headers,
    standard_key,
    standard_signature,
)

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
BODY = b'{"event": {"id": 1, "name": "invoice.create"}}'


def test_standard_webhooks_library_verifies() -> None:
    # Webhook.verify checks the timestamp against the clock, so use a fresh one.
    now = int(time.time())
    headers = signed_headers(SECRET, "msg_7", now, BODY)
    Webhook(SECRET).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(BODY + b" ", headers)


def test_standard_signature_matches_the_library() -> None:
    ours = standard_signature(SECRET, "msg_1", 1_700_000_000, BODY)
    theirs = Webhook(SECRET).sign("msg_1", datetime.fromtimestamp(1_700_000_000, UTC),
                                  BODY.decode())
    assert ours == theirs


def test_key_is_the_decoded_secret() -> None:
    assert standard_key(SECRET) == bytes(range(32))


def test_hook_signature_is_hex_hmac_of_body_keyed_with_secret_string() -> None:
    expected = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    assert hook_signature(SECRET, BODY) == expected
    assert signed_headers(SECRET, "msg_1", 1, BODY)["X-Hook-Signature"] == expected


def test_headers_never_carry_the_secret() -> None:
    headers = signed_headers(SECRET, message_id(5), 1, BODY)
    assert headers["webhook-id"] == "msg_5"
    assert headers["webhook-timestamp"] == "1"
    assert headers["Content-Type"] == "application/json"
    assert all(SECRET[6:] not in v and SECRET not in v for v in headers.values())
