"""Backfills are fair between owners: an owner runs at most WEBHOOKS_MAX_BACKFILLS_PER_OWNER
at once, and batches go to the owner served longest ago, so one owner's many backfills
never hold back another owner's first."""

from __future__ import annotations

import psycopg
import pytest

from tests.support.subscriptions import subscribe

STEP = "SELECT backfill_id FROM webhooks.backfill_step(10, 262144, 1000)"


def test_one_owner_runs_at_most_its_limit_at_once(conn: psycopg.Connection) -> None:
    subs = [subscribe(conn, events=["invoice.create"], owner="big")[0] for _ in range(4)]
    other = subscribe(conn, events=["invoice.create"], owner="small")[0]
    for sid in subs[:3]:
        conn.execute("SELECT webhooks.start_backfill(%s, 3)", (sid,))
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="3 backfills of this owner"):
        conn.execute("SELECT webhooks.start_backfill(%s, 3)", (subs[3],))
    assert conn.execute("SELECT count(*) FROM webhooks.backfills").fetchone() == (3,)
    # Another owner is not counted against it; nor is a backfill that is done.
    conn.execute("SELECT webhooks.start_backfill(%s, 3)", (other,))
    conn.execute("UPDATE webhooks.backfills SET status = 'done'"
                 " WHERE subscription_id = %s", (subs[0],))
    conn.execute("SELECT webhooks.start_backfill(%s, 3)", (subs[3],))


def test_another_owners_first_backfill_is_served_at_once(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO invoices (number, customer, amount)"
                 " SELECT 'F' || g, 'c', 1 FROM generate_series(1, 100) g")
    big = [subscribe(conn, events=["invoice.create"], owner="big")[0] for _ in range(20)]
    for sid in big:  # as a DBA may: no limit
        conn.execute("SELECT webhooks.start_backfill(%s)", (sid,))
    served = [conn.execute(STEP).fetchone()[0] for _ in range(5)]  # type: ignore[index]
    small = subscribe(conn, events=["invoice.create"], owner="small")[0]
    [(mine,)] = conn.execute("SELECT webhooks.start_backfill(%s)", (small,)).fetchall()
    # The big owner was served last: the small owner's backfill is the next batch.
    assert conn.execute(STEP).fetchone() == (mine,)
    # Then they take turns, a batch each, whatever the number of backfills.
    turns = [conn.execute(STEP).fetchone()[0] for _ in range(6)]  # type: ignore[index]
    owners = [conn.execute("SELECT s.owner FROM webhooks.backfills b JOIN webhooks.subscriptions"
                           " s ON s.id = b.subscription_id WHERE b.id = %s", (bid,)
                           ).fetchone()[0] for bid in turns]  # type: ignore[index]
    assert owners == ["big", "small"] * 3, owners
    # Within the big owner, its backfills take turns too (none starves).
    assert len(set(served)) == 5
