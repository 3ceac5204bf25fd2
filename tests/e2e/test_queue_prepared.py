"""The queue's statements have one parameter signature whatever the values
(service/store/base.py: one_signature), and each connection of the worker's queue pool
comes with them prepared and planned (Worker.prepare_queue)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import psycopg
from psycopg.adapt import PyFormat, Transformer

from service.store.base import one_signature
from service.store.worker import ClaimParams
from service.worker.fanout import fanout_params
from service.worker.pacing import claim_params
from tests.support.fanout import drain_outbox
from tests.support.subscriptions import subscribe
from tests.support.worker import running_worker


def signature(conn: psycopg.Connection, params: Mapping[str, object]) -> tuple[int, ...]:
    """The parameter types psycopg sends for `params`, the key it prepares them under."""
    tx = Transformer(conn)
    tx.dump_sequence(list(params.values()), [PyFormat.AUTO] * len(params))
    return tuple(tx.types or ())


def test_the_claim_and_the_fan_out_have_one_signature_whatever_their_values(
        conn: psycopg.Connection) -> None:
    def claim(busy: dict[int, int], owners: dict[str, int],
              since: datetime | None) -> ClaimParams:
        return claim_params(
            limit=100, per_target=4, busy=busy, lease=60.0, scan=100, degraded=list(busy),
            per_owner=8, busy_owners=owners, lane={7: datetime(2026, 1, 1, tzinfo=UTC)},
            since=since)

    quiet = claim({}, {}, None)
    busy = claim({3: 1, 70_000: 2, 5_000_000_000: 1}, {"acme": 4}, datetime.now(UTC))
    # As psycopg types them, the values change the key: each would be prepared apart.
    assert signature(conn, quiet) != signature(conn, busy)
    assert signature(conn, one_signature(quiet)) == signature(conn, one_signature(busy))
    fanouts = [one_signature(fanout_params(10, 1 << 20, lease=c)) for c in (quiet, busy)]
    assert signature(conn, fanouts[0]) == signature(conn, fanouts[1])


def test_array_literals_read_back_as_the_values(conn: psycopg.Connection) -> None:
    when = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)
    owners = ['a"b', "c\\d", "{e,f}", "NULL", " g ", "é"]
    conn.execute("SET DateStyle = 'SQL, DMY'")  # a hostile default: ISO 8601 still reads
    row = conn.execute(
        "SELECT %(ids)s::bigint[], %(owners)s::text[],"
        " %(days)s::timestamptz[] = ARRAY[%(when)s::timestamptz],"
        " %(since)s::timestamptz = %(when)s::timestamptz, %(none)s::timestamptz IS NULL,"
        " %(empty)s::bigint[]",
        one_signature({"ids": [1, 5_000_000_000], "owners": owners, "days": [when],
                       "since": when, "none": None, "empty": []}) | {"when": when}
    ).fetchone()
    assert row == ([1, 5_000_000_000], owners, True, True, True, [])


async def test_each_queue_connection_comes_with_its_statements_planned(db_url: str) -> None:
    async with running_worker(db_url) as worker, worker.queue.pool.connection() as c:
        rows = await (await c.execute(
            "SELECT statement, generic_plans FROM pg_prepared_statements")).fetchall()
    planned = [text for text, generic in rows if generic >= 1]
    assert any("pg_try_advisory_xact_lock" in t for t in planned), rows  # the fan-out
    assert any("lease_expires_at = CASE" in t for t in planned), rows  # the claim
    assert any("jsonb_array_elements" in t for t in planned), rows  # the record


async def test_preparing_a_connection_holds_no_due_delivery_back(
        db_url: str, conn: psycopg.Connection) -> None:
    # A new connection of the queue pool is prepared while the worker claims on others: a
    # claim of nothing that scanned the due deliveries left the oldest locked for a moment,
    # and a claim beside it started later ones first.
    async with running_worker(db_url) as worker:
        await worker.stop()  # its pools stay open until the block ends
        subscribe(conn)
        conn.execute("INSERT INTO invoices (number, customer, amount, company_id)"
                     " SELECT 'P-' || g, 'c', 1, 'acme' FROM generate_series(1, 20) g")
        await drain_outbox(worker.store, 100)
        # Prepared in one transaction here, as if each statement's locks lasted as long as
        # the preparation.
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as fresh, \
                fresh.transaction():
            await worker.prepare_queue(fresh)
            free = conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM webhooks.deliveries"
                " WHERE status = 'pending' FOR UPDATE SKIP LOCKED) x").fetchone()
            conn.rollback()
    assert free == (20,)
