"""SyncStore: the commands' areas on their one plain connection."""

from __future__ import annotations

from service.store.backfill import SyncBackfillQueries
from service.store.deliveries import SyncDeliveryQueries
from service.store.secrets import SyncSecretQueries
from service.store.status import SyncStatusQueries
from service.store.tokens import SyncTokenQueries


class SyncStore(SyncDeliveryQueries, SyncStatusQueries, SyncBackfillQueries,
                SyncTokenQueries, SyncSecretQueries):
    """The named queries the commands run, over one plain (autocommit) connection:
    `SyncStore(conn).list_tokens()`."""
