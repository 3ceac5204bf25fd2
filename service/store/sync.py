"""SyncStore: the commands' areas on their one plain connection."""

from __future__ import annotations

import psycopg

from service import db
from service.store.backfill import SyncBackfillQueries
from service.store.deliveries import SyncDeliveryQueries
from service.store.errors import StoreError
from service.store.secrets import SyncSecretQueries
from service.store.status import SyncStatusQueries
from service.store.tokens import SyncTokenQueries


class SyncStore(SyncDeliveryQueries, SyncStatusQueries, SyncBackfillQueries,
                SyncTokenQueries, SyncSecretQueries):
    """The named queries the commands run, over one plain (autocommit) connection:
    `SyncStore(conn).list_tokens()`."""


def work_due(url: str, timeout: float) -> bool | None:
    """Whether work is due in the database at `url` (SyncStatusQueries.work_due), on a
    connection of its own, everything within about `timeout`; None when the database did
    not answer (the liveness check's question: service/worker/liveness.py)."""
    try:
        with db.connect(url, deadline=timeout, connect_timeout=timeout,
                        tcp_timeout=timeout) as conn:
            return SyncStore(conn).work_due()
    except (psycopg.Error, StoreError, OSError):
        return None
