"""Subscription secrets at rest (sql/queries/secrets.sql), re-sealed by the commands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.store.base import SyncQueries


class SyncSecretQueries(SyncQueries):
    """The subscriptions' secrets, in batches."""

    def count_secrets(self) -> int:
        """How many subscriptions there are."""
        [(total,)] = self._rows("secrets_count")
        return int(total)

    def secrets_batch(self, *, after: int, limit: int) -> list[tuple[Any, ...]]:
        """(id, stored secret) of up to `limit` subscriptions after `after`, locked."""
        return self._rows("secrets_batch", {"after": after, "limit": limit})

    def update_secrets(self, updates: Sequence[tuple[int, str]]) -> None:
        """Stores each (id, secret), in one round trip."""
        self._many("secrets_update", [{"id": sid, "secret": secret} for sid, secret in updates])
