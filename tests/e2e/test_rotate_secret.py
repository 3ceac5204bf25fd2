"""Secret rotation: a new secret verified by the handshake before it is
used, both signatures during WEBHOOKS_SECRET_OVERLAP, only the new one after it; a failed
handshake keeps the old secret. Checked with the `standardwebhooks` library."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import psycopg
import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.support.api import Api
from tests.support.receivers import Received
from tests.support.worker import add_invoice, poll, running_worker

OVERLAP = 1.5
pytestmark = pytest.mark.api_settings(secret_overlap=OVERLAP)


def stored_secret(api: Api, sid: int) -> tuple[str, str | None]:
    ((secret, previous),) = api.sql(
        "SELECT secret, previous_secret FROM webhooks.subscriptions WHERE id = %s", sid)
    return secret, previous


def verifies(secret: str, req: Received) -> bool:
    headers = {k.lower(): v for k, v in req.headers.items()}
    try:
        Webhook(secret).verify(req.body, headers)
    except WebhookVerificationError:
        return False
    return True


def handshake_secrets(api: Api) -> list[str]:
    lowered = ({k.lower(): v for k, v in r.headers.items()} for r in api.receiver.received)
    return [h["x-hook-secret"] for h in lowered if "x-hook-secret" in h]


async def test_rotation_signs_with_both_during_the_overlap_then_only_the_new(
        api: Api, db_url: str, conn: psycopg.Connection) -> None:
    sub = await api.create()
    old, _ = stored_secret(api, sub["id"])
    async with running_worker(db_url):
        response = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/rotate_secret")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert body == {**sub, **{k: body[k] for k in ("last_status", "last_success_at",
                                                       "last_failure_at",
                                                       "last_failure_content")}}
        new = handshake_secrets(api)[-1]
        assert new != old and new not in response.text and old not in response.text
        assert stored_secret(api, sub["id"]) == (new, old)

        add_invoice(conn, "DURING")
        await api.receiver.wait_for(lambda r: len(r.deliveries()) == 1)
        during = api.receiver.deliveries()[0]
        new_signature, old_signature = during.headers["webhook-signature"].split(" ")
        assert new_signature.startswith("v1,") and old_signature.startswith("v1,")
        # A receiver holding either secret verifies; the new signature comes first.
        assert verifies(old, during) and verifies(new, during)
        assert not verifies(old, _only(during, new_signature))
        assert during.headers["X-Hook-Signature"] == hmac.new(
            new.encode(), during.body, hashlib.sha256).hexdigest()

        await poll(lambda: api.sql("SELECT previous_secret_expires_at < now() "
                                   "FROM webhooks.subscriptions WHERE id = %s",
                                   sub["id"]) == [(True,)],
                   timeout=OVERLAP + 10, what="the end of the overlap")
        add_invoice(conn, "AFTER")
        await api.receiver.wait_for(lambda r: len(r.deliveries()) == 2)
        after = api.receiver.deliveries()[1]
        assert json.loads(after.body)["resource"]["number"] == "AFTER"
        assert " " not in after.headers["webhook-signature"]
        assert verifies(new, after) and not verifies(old, after)


def _only(req: Received, signature: str) -> Received:
    """`req` as if its webhook-signature carried only `signature`."""
    return Received(req.method, req.path, {**req.headers, "webhook-signature": signature},
                    req.body, req.at)


async def _no_echo(req: Received) -> web.StreamResponse:
    return web.Response(status=200)


async def test_a_failed_handshake_keeps_the_old_secret(
        api: Api, db_url: str, conn: psycopg.Connection) -> None:
    sub = await api.create()
    old, _ = stored_secret(api, sub["id"])
    api.receiver.behaviour = _no_echo
    response = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/rotate_secret")
    assert response.status_code == 400
    assert set(response.json()) == {"error"}
    assert "X-Hook-Secret" in response.json()["error"]
    tried = handshake_secrets(api)[-1]
    assert tried != old and tried not in response.text
    assert stored_secret(api, sub["id"]) == (old, None)
    async with running_worker(db_url):
        add_invoice(conn, "OLD")
        await api.receiver.wait_for(lambda r: len(r.deliveries()) == 1)
    (delivery,) = api.receiver.deliveries()
    assert " " not in delivery.headers["webhook-signature"]
    assert verifies(old, delivery) and not verifies(tried, delivery)


async def test_rotation_of_another_owners_or_unknown_subscription_is_404(api: Api) -> None:
    sub = await api.create()
    other = api.new_token("mallory")
    for path, token in ((f"/api/v1/webhooks/{sub['id']}/rotate_secret", other),
                        ("/api/v1/webhooks/999999/rotate_secret", None),
                        ("/api/v1/webhooks/abc/rotate_secret", None)):
        response = await api.request("POST", path, token=token)
        assert response.status_code == 404, path
        assert set(response.json()) == {"error"}
    assert len(handshake_secrets(api)) == 1  # only the creation's


async def test_rotate_secret_is_in_the_openapi_document(api: Api) -> None:
    document = (await api.http.get("/schema/openapi.json")).json()
    operation = document["paths"]["/api/v1/webhooks/{webhook_id}/rotate_secret"]["post"]
    assert {"200", "400", "401", "404", "429"} <= set(operation["responses"])


KEY = "d2ViaG9va3Mgcm90YXRpb24gdGVzdCBrZXkgMzIgYiE="  # urlsafe base64 of 32 bytes: a Fernet key


@pytest.mark.api_settings(secret_overlap=OVERLAP, encryption_key=KEY)
async def test_both_secrets_stay_encrypted_at_rest(
        api: Api, db_url: str, conn: psycopg.Connection) -> None:
    sub = await api.create()
    response = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/rotate_secret")
    assert response.status_code == 200, response.text
    first, new = handshake_secrets(api)
    secret, previous = stored_secret(api, sub["id"])
    assert secret.startswith("fernet:") and previous is not None
    assert previous.startswith("fernet:")
    assert new not in secret and first not in previous
    async with running_worker(db_url, encryption_key=KEY):
        add_invoice(conn, "SEALED")
        await api.receiver.wait_for(lambda r: len(r.deliveries()) == 1)
    (delivery,) = api.receiver.deliveries()
    assert verifies(first, delivery) and verifies(new, delivery)
