"""The delivery log and its requeues (sql/queries/deliveries.sql): the API's, async and
scoped by owner, and the commands', on their plain connection."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from service.store.base import AsyncQueries, SyncQueries


class DeliveryQueries(AsyncQueries):
    """A subscription's deliveries, as the API shows and requeues them."""

    async def delivery_subscription(self, *, id: int, owner: str, tenant: str | None
                                    ) -> dict[str, Any] | None:
        """The caller's subscription ({"id", "active"}), or None."""
        return await self._one("deliveries_subscription",
                               {"id": id, "owner": owner, "tenant": tenant})

    async def list_deliveries(self, *, subscription_id: int, status: str | None,
                              event: str | None, since: datetime | None,
                              until: datetime | None, before: int | None, limit: int
                              ) -> list[dict[str, Any]]:
        """A page of the subscription's deliveries, newest first."""
        return await self._all("deliveries_list", {
            "subscription_id": subscription_id, "status": status, "event": event,
            "since": since, "until": until, "before": before, "limit": limit})

    async def get_delivery(self, *, id: int, subscription_id: int | None
                           ) -> dict[str, Any] | None:
        """One delivery with its payload (of the subscription, when one is given)."""
        return await self._one("deliveries_get", {"id": id, "subscription_id": subscription_id})

    async def delivery_attempts(self, *, id: int) -> list[dict[str, Any]]:
        """Every attempt of the delivery, oldest first."""
        return await self._all("deliveries_attempts", {"id": id}, row=dict_row)

    async def delivery_stats(self, *, id: int, hours: int) -> list[dict[str, Any]]:
        """The subscription's attempts per hour ({"hour", "succeeded", "failed",
        "unanswered"}) over the last `hours`, oldest first, every hour present."""
        return await self._all("deliveries_stats", {"id": id, "hours": hours})

    async def redeliver(self, *, id: int) -> None:
        """Makes the delivery pending and due now (raises on an unknown or inactive one)."""
        await self._one("deliveries_redeliver", {"id": id})

    async def recover(self, *, subscription_id: int, since: datetime,
                      until: datetime | None) -> int:
        """Requeues the failed deliveries created in [since, until); how many."""
        row = await self._one("deliveries_recover",
                              {"subscription_id": subscription_id, "since": since,
                               "until": until})
        return int(row["requeued"])

    async def queue_test_delivery(self, *, id: int) -> dict[str, Any] | None:
        """A webhook.test event and its delivery ({"id"}); None when inactive or unknown."""
        return await self._one("deliveries_test", {"id": id})


class SyncDeliveryQueries(SyncQueries):
    """Any subscription's deliveries, as the commands show and requeue them."""

    def subscription_exists(self, *, id: int) -> bool:
        """Whether a subscription has this id."""
        return bool(self._rows("deliveries_subscription_any", {"id": id}))

    def list_deliveries(self, *, subscription_id: int, status: str | None,
                        event: str | None, since: datetime | None, until: datetime | None,
                        before: int | None, limit: int) -> list[dict[str, Any]]:
        """A page of the subscription's deliveries, newest first."""
        return self._rows("deliveries_list", {
            "subscription_id": subscription_id, "status": status, "event": event,
            "since": since, "until": until, "before": before, "limit": limit}, row=dict_row)

    def get_delivery(self, *, id: int) -> dict[str, Any] | None:
        """One delivery with its payload, whatever its subscription."""
        rows = self._rows("deliveries_get", {"id": id, "subscription_id": None},
                          row=dict_row)
        return rows[0] if rows else None

    def delivery_attempts(self, *, id: int) -> list[dict[str, Any]]:
        """Every attempt of the delivery, oldest first."""
        return self._rows("deliveries_attempts", {"id": id}, row=dict_row)

    def redeliver(self, *, id: int) -> None:
        """Makes the delivery pending and due now (raises on an unknown or inactive one)."""
        self._rows("deliveries_redeliver", {"id": id})

    def recover(self, *, subscription_id: int, since: datetime, until: datetime | None
                ) -> int:
        """Requeues the failed deliveries created in [since, until); how many."""
        [(count,)] = self._rows("deliveries_recover", {
            "subscription_id": subscription_id, "since": since, "until": until})
        return int(count)
