"""The store: every named query of the service runs through here (sql/queries/*.sql), one
method per query, and database errors leave it as the service's own exceptions.

The API and the worker hold a `Store` over their pool (and its `Session`s for
transactions); the commands, which use one plain connection, a `SyncStore`. The methods
are grouped by area, a module each, as the query files are: api.py, deliveries.py,
lifecycle.py, backfill.py, fanout.py, worker.py, status.py, tokens.py, secrets.py; base.py
runs a named query, errors.py turns psycopg's errors into StoreError (the one place that
catches them), pool.py and sync.py put the areas together. Nothing else executes a named
query (import-linter keeps service.db, the plumbing, away from the API and the worker).
"""

from service.store.deadline import DeadlineExceeded, budget, watched
from service.store.errors import StoreError, StoreRejected, StoreUnavailable, translated
from service.store.pool import QUEUE_SETTINGS, Session, Store, connect, make_pool
from service.store.sync import SyncStore, work_due

__all__ = ["QUEUE_SETTINGS", "DeadlineExceeded", "Session", "Store", "StoreError",
           "StoreRejected", "StoreUnavailable", "SyncStore", "budget", "connect", "make_pool",
           "translated", "watched", "work_due"]
