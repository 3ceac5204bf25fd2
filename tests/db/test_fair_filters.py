"""What one owner's filters may cost everyone, short of the API: a total budget per
filter (values, bytes, compiled size), and fan-out reading each compiled filter from its
subscription, by primary key, only for the registry rows that have one (the budget per
owner over HTTP, and the registry holding no copy: tests/e2e/test_fair_filters.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from service import filters
from service.db import query
from service.store import Store
from service.worker.fanout import fanout_params
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe_many
from tests.support.worker import open_pool

COLUMNS = ["a", "b", "c"]


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with open_pool(db_url, max_size=4) as p:
        yield p


@pytest.mark.parametrize(("given", "fragment"), [
    ({"a": {"in": list(range(100))}, "b": {"nin": list(range(100))}, "c": 1},
     "201 values in all, over the limit of 200 values"),
    ({"a": {"in": list(range(100))}, "b": {"in": list(range(100))}, "$changed": ["a"]},
     "limit of 200 values"),
    ({"a": {"in": ["x" * 1000] * 9}}, "over the limit of 8192 bytes per filter"),
    ({"a": {"in": ["é" * 1000] * 3}}, "over the limit of 16384 compiled bytes"),
])
def test_a_filter_has_a_total_budget(given: Any, fragment: str) -> None:
    with pytest.raises(filters.FilterError) as info:
        filters.check(given, COLUMNS, COLUMNS)
    assert fragment in str(info.value)


def test_a_filter_within_the_budget_passes() -> None:
    largest = {"a": {"in": list(range(100))}, "b": {"nin": list(range(100))}}
    assert filters.check(largest, COLUMNS, COLUMNS) == largest
    assert filters.literals(largest) == filters.MAX_LITERALS


async def test_fanout_reads_the_filter_from_the_subscription(
        conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    subscribe_many(conn, 3, resource="invoices", events=["invoice.create"], owner="o")
    conn.execute("UPDATE webhooks.subscriptions SET filter = %s, filter_path = %s"
                 " WHERE tenant = 't1'",
                 ('{"number": "keep"}', filters.compile_path({"number": "keep"})))
    assert conn.execute("SELECT count(*) FILTER (WHERE filtered), count(*)"
                        " FROM webhooks.subscription_events").fetchone() == (1, 3)
    conn.execute("UPDATE webhooks.subscriptions SET tenant = NULL")
    for number in ("keep", "drop"):
        conn.execute("INSERT INTO invoices (number, customer, amount) VALUES (%s, 'c', 1)",
                     (number,))
    await drain_outbox(Store(pool), 100)
    got = conn.execute(
        "SELECT s.tenant IS NULL, s.filter IS NOT NULL, count(*) FROM webhooks.deliveries d"
        " JOIN webhooks.subscriptions s ON s.id = d.subscription_id"
        " GROUP BY 1, 2 ORDER BY 2").fetchall()
    assert got == [(True, False, 4), (True, True, 1)]


def test_fanout_looks_filters_up_by_primary_key(conn: psycopg.Connection) -> None:
    subscribe_many(conn, 2000, resource="invoices", events=["invoice.create"], owners=50)
    conn.execute("UPDATE webhooks.subscriptions SET filter = '{}', filter_path = %s"
                 " WHERE id %% 2 = 0", (filters.compile_path({"number": "x"}),))
    conn.execute("ANALYZE webhooks.subscriptions")
    conn.execute("ANALYZE webhooks.subscription_events")
    conn.execute("INSERT INTO invoices (number, customer, amount) VALUES ('x', 'c', 1)")
    plan = "\n".join(r[0] for r in conn.execute(
        ("EXPLAIN " + query("fanout")).encode(),
        fanout_params(100, 1000)).fetchall())
    # The registry is read as before; a filter is one primary-key lookup, only for the
    # registry rows that say their subscription has one.
    matched = plan.split("CTE matched")[1].split("\n  CTE ")[0]
    assert "subscriptions_pkey" in matched and "NOT se.filtered" in matched, plan
    assert "Seq Scan on subscriptions" not in plan, plan
