"""The store's exceptions, and the one place where psycopg's errors become them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import psycopg
from psycopg_pool import PoolTimeout


class StoreError(Exception):
    """A named query failed; `sqlstate` is PostgreSQL's code, when it gave one."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class StoreUnavailable(StoreError):
    """The database could not be reached, or the connection broke: try again later."""


class StoreRejected(StoreError):
    """The database refused the statement (its data, a constraint, a timeout)."""

    @property
    def data_error(self) -> bool:
        """Whether the data was at fault (SQLSTATE classes 22 and 54), not the statement."""
        return (self.sqlstate or "")[:2] in ("22", "54")


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Turns psycopg's and the network's errors into StoreError subclasses; in a task
    that is being cancelled, into the cancellation."""
    try:
        yield
    except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, OSError) as exc:
        _cancelling(exc)
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate and sqlstate[:2] not in ("08", "53", "57"):
            raise StoreRejected(str(exc), sqlstate) from exc
        if sqlstate in ("57014", "55P03"):
            raise StoreRejected(str(exc), sqlstate) from exc
        raise StoreUnavailable(str(exc) or type(exc).__name__, sqlstate) from exc
    except psycopg.Error as exc:
        _cancelling(exc)
        raise StoreRejected(str(exc), exc.sqlstate) from exc


def _cancelling(exc: BaseException) -> None:
    """Raises CancelledError when the running task is being cancelled. A cancellation
    that lands during a statement makes psycopg cancel it on the server and roll back, and
    an error of that cleanup (the query cancelled, the connection closed) can come out
    instead of the CancelledError: as a StoreError, a loop that retries on StoreError (the
    backfills', the recorder's) would go on, and the worker's shutdown would wait for it
    forever."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        return
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc
