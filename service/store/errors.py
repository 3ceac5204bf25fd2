"""The store's exceptions, and the one place where psycopg's errors become them."""

from __future__ import annotations

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

    @property
    def timed_out(self) -> bool:
        """Whether a statement or lock timeout cancelled the statement."""
        return self.sqlstate in ("57014", "55P03")


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Turns psycopg's and the network's errors into StoreError subclasses."""
    try:
        yield
    except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, OSError) as exc:
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate and sqlstate[:2] not in ("08", "53", "57"):
            raise StoreRejected(str(exc), sqlstate) from exc
        if sqlstate in ("57014", "55P03"):
            raise StoreRejected(str(exc), sqlstate) from exc
        raise StoreUnavailable(str(exc) or type(exc).__name__, sqlstate) from exc
    except psycopg.Error as exc:
        raise StoreRejected(str(exc), exc.sqlstate) from exc
