"""The API's secret rotation (sql/queries/rotation.sql), scoped like every subscription
query."""

from __future__ import annotations

from service.store.base import AsyncQueries


class RotationQueries(AsyncQueries):
    """A subscription's secret, as the API rotates it."""

    async def rotation_target(self, *, id: int, owner: str, tenant: str | None
                              ) -> str | None:
        """The target of the caller's subscription, or None when it is not the caller's."""
        row = await self._one("rotation_target", {"id": id, "owner": owner, "tenant": tenant})
        return None if row is None else str(row["target"])

    async def rotate_secret(self, *, id: int, owner: str, tenant: str | None, target: str,
                            secret: str, overlap: float) -> str | None:
        """Replaces the secret (the old one signs for `overlap` seconds); the subscription's
        JSON document, or None when it is gone or its target changed."""
        row = await self._one("rotation_rotate", {
            "id": id, "owner": owner, "tenant": tenant, "target": target, "secret": secret,
            "overlap": overlap})
        return None if row is None else str(row["doc"])
