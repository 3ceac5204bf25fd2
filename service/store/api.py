"""The REST API's subscription queries (sql/queries/api.sql). Every subscription query is
scoped by owner, and by tenant when the token has one."""

from __future__ import annotations

from typing import Any

from psycopg.rows import tuple_row

from service.store.base import AsyncQueries


class ApiQueries(AsyncQueries):
    """Subscriptions, events and health, as the API asks for them."""

    async def ping(self) -> None:
        """Runs `SELECT 1`: the database answers."""
        await self._run("api_ping")

    async def resource_events(self, *, resource: str) -> list[tuple[Any, ...]]:
        """The resource's registry: (event, public, own noun) rows."""
        return await self._all("api_resource_events", {"resource": resource}, row=tuple_row)

    async def public_resources(self) -> list[tuple[Any, ...]]:
        """The resources that can be subscribed to, as (name,) rows."""
        return await self._all("api_public_resources", row=tuple_row)

    async def event_columns(self, *, resource: str, events: list[str]
                            ) -> list[dict[str, Any]]:
        """For each event, whether it sends a row and the columns it may send."""
        return await self._all("api_event_columns", {"resource": resource, "events": events})

    async def own_noun(self, *, resource: str) -> dict[str, Any] | None:
        """The noun of the table attached as the resource ({"noun"}), if any."""
        return await self._one("api_own_noun", {"resource": resource})

    async def hook_events(self) -> list[dict[str, Any]]:
        """Every public event ({"resource", "event"}), by resource and name."""
        return await self._all("api_hook_events")

    async def event_catalog(self) -> list[dict[str, Any]]:
        """Each table with public events (and each resource of the service's own events):
        its events, its attachment and its columns, for the schemas of their bodies
        (service.api.schemas)."""
        return await self._all("api_event_catalog")

    async def lock_owner(self, *, owner: str) -> None:
        """Serialises the owner's creations until the transaction ends."""
        await self._run("api_owner_lock", {"owner": owner})

    async def count_subscriptions(self, *, owner: str) -> int:
        """How many subscriptions the owner has."""
        (count,) = await self._one("api_subscription_count", {"owner": owner}, row=tuple_row)
        return int(count)

    async def insert_subscription(self, *, owner: str, tenant: str | None, resource: str,
                                  events: list[str], target: str, secret: str, max: int,
                                  filter: Any, filter_path: str | None, ordering: str,
                                  rate_limit: int | None = None) -> dict[str, Any] | None:
        """The new subscription ({"id", "doc"}), or None when the owner has `max`."""
        return await self._one("api_subscription_insert", {
            "owner": owner, "tenant": tenant, "resource": resource, "events": events,
            "target": target, "secret": secret, "max": max, "filter": filter,
            "filter_path": filter_path, "ordering": ordering, "rate_limit": rate_limit})

    async def list_subscriptions(self, *, token_hash: bytes, resource: str | None,
                                 active: bool | None, after: int, limit: int, max_bytes: int
                                 ) -> tuple[Any, ...] | None:
        """The token's (id, owner, tenant, hash), then a page of its owner's subscriptions,
        oldest first, as the JSON array text, the page's last id (None when empty) and
        whether more follow; None when the token is unknown or revoked."""
        return await self._one("api_subscription_list", {
            "token_hash": token_hash, "resource": resource, "active": active,
            "after": after, "limit": limit, "max_bytes": max_bytes}, row=tuple_row)

    async def get_subscription(self, *, token_hash: bytes, id: int
                               ) -> tuple[Any, ...] | None:
        """The token's (id, owner, tenant, hash) and the subscription's JSON document (None
        when it is not the token's), or None when the token is unknown or revoked."""
        return await self._one("api_subscription_get", {"token_hash": token_hash, "id": id},
                               row=tuple_row)

    async def lock_subscription(self, *, id: int, owner: str, tenant: str | None
                                ) -> dict[str, Any] | None:
        """The subscription's row, locked until the transaction ends, or None."""
        return await self._one("api_subscription_lock",
                               {"id": id, "owner": owner, "tenant": tenant})

    async def set_subscription_active(self, *, id: int, owner: str, tenant: str | None,
                                      active: bool, rate_limit: int | None
                                      ) -> dict[str, Any] | None:
        """Sets `active` and `rate_limit`; the subscription ({"id", "doc"}), or None when
        not found."""
        return await self._one("api_subscription_set_active",
                               {"id": id, "owner": owner, "tenant": tenant, "active": active,
                                "rate_limit": rate_limit})

    async def delete_subscription(self, *, id: int, owner: str, tenant: str | None) -> bool:
        """Deletes the subscription; False when it is not the caller's."""
        rows = await self._all("api_subscription_delete",
                               {"id": id, "owner": owner, "tenant": tenant})
        return bool(rows)

    async def settle_waiting(self, *, id: int, among: list[str] | None) -> list[str] | None:
        """The writers (of `among`, when given) whose capture probe could not see the newly
        active subscription yet; None when it is no longer active."""
        (waiting,) = await self._one("api_settle_waiting", {"id": id, "among": among},
                                     row=tuple_row)
        return list(waiting) if waiting is not None else None

    async def settle_start(self, *, id: int) -> None:
        """Starts the subscription's capture from now (webhooks.settle_start)."""
        await self._one("api_settle_start", {"id": id})

    async def owner_filter_bytes(self, *, owner: str, id: int, filter_path: str
                                 ) -> dict[str, Any]:
        """What the owner's other active filters compile to ({"used"}) and `filter_path`
        ({"wanted"}), in bytes."""
        return await self._one("api_owner_filter_bytes",
                               {"owner": owner, "id": id, "filter_path": filter_path})

    async def subscription_filter_path(self, *, id: int, owner: str, tenant: str | None
                                       ) -> str | None:
        """The owner's (tenant's) subscription's compiled filter, or None."""
        row = await self._one("api_subscription_filter_path",
                              {"id": id, "owner": owner, "tenant": tenant})
        return row["filter_path"] if row else None

    async def subscription_target(self, *, id: int, owner: str, tenant: str | None
                                  ) -> str | None:
        """The caller's subscription's target, or None when it is not the caller's."""
        row = await self._one("api_subscription_target",
                              {"id": id, "owner": owner, "tenant": tenant})
        return None if row is None else str(row["target"])

    async def set_subscription_target(self, *, id: int, owner: str, tenant: str | None,
                                      target: str, previous: str, secret: str,
                                      overlap: float) -> bool:
        """Moves the owner's (tenant's) subscription to `target` with the (sealed) `secret`
        it verified, if its target is still `previous`; the secret it replaces signs for
        `overlap` s."""
        return await self._one("api_subscription_set_target", {
            "id": id, "owner": owner, "tenant": tenant, "target": target,
            "previous": previous, "secret": secret, "overlap": overlap}) is not None
