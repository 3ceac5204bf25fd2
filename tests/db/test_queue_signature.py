"""The queue's statements have one parameter signature whatever the values
(service/store/base.py: one_signature), so that each is prepared once, and the array
literals it sends read back as the values (the worker's queue pool preparing them:
tests/e2e/test_queue_prepared.py)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import psycopg
from psycopg.adapt import PyFormat, Transformer

from service.store.base import one_signature
from service.store.worker import ClaimParams
from service.worker.fanout import fanout_params
from service.worker.pacing import claim_params


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
