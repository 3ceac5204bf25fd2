"""Secret rotation: `POST /api/v1/webhooks/:id/rotate_secret`.

A fresh secret is verified with the handshake of creation (the target echoes
`X-Hook-Secret`) before it is stored; the secret it replaces keeps signing beside it for
WEBHOOKS_SECRET_OVERLAP (the worker sends `webhook-signature: v1,<new> v1,<old>`), so
receivers can switch secrets without losing a delivery. The answer is the subscription,
never a secret. Scoping is the subscriptions': another owner's or tenant's id is 404.
"""

from __future__ import annotations

from typing import Any, cast

from litestar import MediaType, Response, post

from service.api.checks import verified_secret
from service.api.deps import (
    BoxDep,
    ClientDep,
    IdPath,
    MetricsDep,
    PrincipalDep,
    SettingsDep,
    StoreDep,
)
from service.api.errors import ApiError, error_responses
from service.api.models import Subscription, parse_id, shown

_ERRORS = (400, 401, 404, 405, 413, 429, 503)
_DOCS = {400: "the target did not pass the handshake with the new secret (the old secret "
              "stays), or the request is malformed"}


@post("/webhooks/{webhook_id:str}/rotate_secret",
      summary="Rotate the secret (after a handshake with the new one)", status_code=200,
      response_description="the subscription; the secret is never shown",
      responses=error_responses(*_ERRORS, docs=_DOCS))
async def rotate_secret(
    webhook_id: IdPath,
    principal: PrincipalDep,
    store: StoreDep,
    client: ClientDep,
    settings: SettingsDep,
    box: BoxDep,
    metrics: MetricsDep,
) -> Response[Subscription]:
    """Verifies a new secret with the target, then signs with it, and for
    WEBHOOKS_SECRET_OVERLAP with the previous one too; on a failed handshake, 400 and
    nothing changes."""
    number = parse_id(webhook_id)
    if number is None:
        raise ApiError(404, f"no webhook with id {shown(webhook_id)}")
    target = await store.rotation_target(id=number, owner=principal.owner,
                                         tenant=principal.tenant)
    if target is None:
        raise ApiError(404, f"no webhook with id {number}")
    secret = await verified_secret(
        client, target, settings, metrics,
        "target verification of the new secret failed, the secret is unchanged")
    updated = await store.rotate_secret(id=number, owner=principal.owner,
                                        tenant=principal.tenant, target=target,
                                        secret=box.seal(secret),
                                        overlap=settings.secret_overlap)
    if updated is None:
        raise ApiError(404, f"no webhook with id {number}")
    return Response(cast(Any, updated.encode()), media_type=MediaType.JSON)


HANDLERS = [rotate_secret]
