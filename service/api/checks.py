"""What creating or changing a subscription checks before anything is stored: the
resource's events, the filter and the owner's filter budget, the target (scheme, length,
SSRF rules) and its verification handshake, and the settling of a subscription that just
became active. The routes are in service.api.webhooks."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from psycopg.types.json import Jsonb

from service import events, filters
from service.api.errors import ApiError
from service.api.handshake import HandshakeFailed, Outbound, new_secret, verify
from service.api.metrics import ApiMetrics
from service.api.models import shown
from service.config import Settings
from service.crypto import SecretBox
from service.ssrf import TargetRejected, check_target
from service.store import Session, Store
from service.tokens import Principal

log = logging.getLogger("webhooks.api")


async def resource_registry(store: Store, resource: str
                            ) -> tuple[dict[str, bool], str | None, list[str]]:
    """The resource's events (name -> public), its own noun, and the subscribable resources."""
    async with store.session() as s:
        rows = await s.resource_events(resource=resource)
        if any(public for _, public, _ in rows):
            return {r[0]: r[1] for r in rows}, rows[0][2], []
        names = await s.public_resources()
    return {}, None, [r[0] for r in names]


async def canonical_events(store: Store, resource: str, text: str, max_events: int
                            ) -> list[str]:
    """The checked canonical events of a subscription to `resource`; 400 if any is wrong."""
    registry, own_noun, resources = await resource_registry(store, resource)
    if not registry:
        raise ApiError(400, f"unknown resource {shown(resource)}; resources that can be "
                            f"subscribed to: {', '.join(resources) or 'none'} "
                            "(see /api/v1/hook_events)")
    try:
        return events.canonicalise(text, own_noun, registry, resource, max_events)
    except events.EventsError as exc:
        raise ApiError(400, str(exc)) from None


async def checked_filter(store: Store, resource: str, names: list[str], given: Any
                         ) -> tuple[Jsonb | None, str | None]:
    """The checked filter and its compiled path (SPEC section 9); 400 naming what is wrong.
    A column must be sent by every event of the subscription."""
    if given is None:
        return None, None
    rows = await store.event_columns(resource=resource, events=names)
    if any(r["columns"] is None for r in rows):
        raise ApiError(400, "filter: the service's own webhook.* events carry no row to "
                            "filter on")
    named = set.intersection(*(set(r["columns"]) for r in rows)) if rows else set()
    sent = None if any(not r["include_row"] for r in rows) else sorted(named)
    try:
        checked = filters.check(given, sent, sorted(named))
    except filters.FilterError as exc:
        raise ApiError(400, str(exc)) from None
    path = filters.compile_path(checked)
    return (Jsonb(checked), path) if path is not None else (None, None)


async def settle(store: Store, subscription_id: int, settings: Settings) -> None:
    """Makes a subscription that just became active exact (webhooks.settle_waiting in
    sql/triggers/capture.sql): waits for the writers whose capture probe ran before it
    could be seen, then starts it. Each check is one short query, and no connection is
    held between checks, so activations waiting for a long application transaction leave
    the pool to everyone else's requests."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.verify_timeout
    pause = 0.005
    waiting: list[str] | None = None
    while True:
        waiting = await store.settle_waiting(id=subscription_id, among=waiting)
        if waiting is None:
            return  # made inactive or deleted meanwhile: nothing to start
        left = deadline - loop.time()
        if not waiting or left <= 0:
            break
        await asyncio.sleep(min(pause, left))
        # Short at first (most writers commit within milliseconds), then gentler on
        # pg_locks while a long transaction stays open.
        pause = min(pause * 2, 0.1)
    await store.settle_start(id=subscription_id)
    if waiting:
        log.warning("subscription %s: a transaction writing to its resource was still open "
                    "after %gs; its changes may not reach the new subscription",
                    subscription_id, settings.verify_timeout)


async def allowed_target(target: str, settings: Settings) -> None:
    """400 unless `target` may be a target (scheme, length, SSRF rules), checked within the
    verify timeout."""
    try:
        # The whole check, not only each lookup, is bounded by the verify timeout.
        async with asyncio.timeout(settings.verify_timeout):
            await check_target(target, settings.allow_private_targets,
                               settings.max_target_length,
                               timeout=min(settings.dns_timeout, settings.verify_timeout),
                               nameservers=settings.dns_servers or None)
    except TargetRejected as exc:
        raise ApiError(400, str(exc)) from None
    except TimeoutError:
        raise ApiError(400, f"target host did not resolve within {settings.verify_timeout:g} "
                            "seconds") from None


async def verified_secret(client: Outbound, target: str, settings: Settings,
                          metrics: ApiMetrics, refused: str) -> str:
    """A newly made secret that `target` has echoed in the verification handshake (no
    connection is held meanwhile: it may take the whole verify timeout); 400 starting
    with `refused` and saying what the target did, when it has not."""
    secret = new_secret()
    try:
        await verify(client, target, secret, settings.verify_timeout)
    except HandshakeFailed as exc:
        metrics.handshake(exc.outcome)
        raise ApiError(400, f"{refused}: {exc}") from None
    metrics.handshake("verified")
    return secret


async def move_target(store: Store, number: int, target: str, principal: Principal,
                       settings: Settings, client: Outbound, box: SecretBox,
                       metrics: ApiMetrics) -> None:
    """Moves the subscription to `target` once the target has echoed a newly made secret
    (never the live one: a URL nobody verified yet gets nothing that signs; no connection
    is held during the handshake). The new secret then signs, and the one it replaces
    beside it for WEBHOOKS_SECRET_OVERLAP, as after a rotation; 400 and nothing changed
    when the handshake fails. Nothing to do when `target` is the current one."""
    current = await store.subscription_target(id=number, owner=principal.owner,
                                              tenant=principal.tenant)
    if current is None:
        raise ApiError(404, f"no webhook with id {number}")
    if current == target:
        return
    await allowed_target(target, settings)
    secret = await verified_secret(client, target, settings, metrics,
                                   "target verification failed, the target is unchanged")
    if not await store.set_subscription_target(id=number, owner=principal.owner,
                                               tenant=principal.tenant, target=target,
                                               previous=current, secret=box.seal(secret),
                                               overlap=settings.secret_overlap):
        raise ApiError(409, f"webhook {number}'s target changed during the handshake; "
                            "send the request again")


async def check_filter_budget(session: Session, principal: Principal, subscription_id: int,
                               path: str | None, settings: Settings) -> None:
    """400 when activating a subscription with filter `path` would take the owner's active
    filters past WEBHOOKS_MAX_FILTER_BYTES_PER_OWNER."""
    if path is None:
        return
    row = await session.owner_filter_bytes(owner=principal.owner, id=subscription_id,
                                           filter_path=path)
    limit = settings.max_filter_bytes_per_owner
    if row["used"] + row["wanted"] > limit:
        raise ApiError(400, f"this filter compiles to {row['wanted']} bytes and this owner's "
                            f"active subscriptions' filters to {row['used']}, over the limit "
                            f"of {limit} bytes per owner (WEBHOOKS_MAX_FILTER_BYTES_PER_OWNER); "
                            "pause or delete a filtered subscription, or use a smaller filter")


def too_many(limit: int) -> ApiError:
    """The owner has as many subscriptions as it may."""
    return ApiError(400, f"this owner already has {limit} subscriptions, the most allowed "
                         "(WEBHOOKS_MAX_SUBSCRIPTIONS_PER_OWNER); delete one first")
