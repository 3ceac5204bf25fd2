"""How the store's errors come out of a task that is being cancelled."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from service.store import StoreError
from service.store.errors import StoreRejected, StoreUnavailable, translated


async def _fail_while(cancelling: bool, exc: Exception) -> None:
    task = asyncio.current_task()
    assert task is not None
    if cancelling:
        task.cancel()  # requested: the next await would raise it
    with translated():
        raise exc


@pytest.mark.parametrize("exc", [psycopg.OperationalError("server closed the connection"),
                                 psycopg.errors.QueryCanceled("canceling statement"),
                                 psycopg.errors.UniqueViolation("duplicate key")])
async def test_an_error_of_a_cancelled_statement_is_the_cancellation(exc: Exception) -> None:
    # psycopg cancels the statement on the server when its task is cancelled, and an
    # error of that cleanup may come out instead of the CancelledError: a loop that
    # retries on StoreError would then never stop.
    task = asyncio.create_task(_fail_while(True, exc))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


@pytest.mark.parametrize("exc, kind", [
    (psycopg.OperationalError("server closed the connection"), StoreUnavailable),
    (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
     StoreRejected),
])
async def test_outside_a_cancellation_errors_stay_store_errors(
        exc: Exception, kind: type[StoreError]) -> None:
    with pytest.raises(kind):
        await asyncio.create_task(_fail_while(False, exc))


def test_outside_an_event_loop_errors_stay_store_errors() -> None:
    with pytest.raises(StoreUnavailable), translated():
        raise psycopg.OperationalError("no loop here")
