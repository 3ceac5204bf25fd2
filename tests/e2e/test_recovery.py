"""Redelivery and recovery: an outage (a receiver answering 503) exhausts
the retry schedule, recover brings the failed deliveries back, and they succeed with the
same ids, in event order; the SQL functions underneath, their errors and their rights."""

from __future__ import annotations

import uuid
from datetime import datetime

import psycopg
import pytest
from aiohttp import web

from tests.support.api import Api, assert_error
from tests.support.receivers import Received, echo_secret
from tests.support.subscriptions import subscribe
from tests.support.worker import add_invoice, poll, running_worker


class Outage:
    """A target that answers 503 while `down`, and remembers which deliveries it took."""

    def __init__(self) -> None:
        self.down = True
        self.taken: list[int] = []

    async def __call__(self, req: Received) -> web.StreamResponse:
        if "x-hook-secret" in req.headers:
            return await echo_secret(req)
        if self.down:
            return web.Response(status=503, text="down for maintenance")
        self.taken.append(int(req.headers["webhook-id"].removeprefix("msg_")))
        return web.Response(status=200)


def statuses(conn: psycopg.Connection, sid: int) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT status FROM webhooks.deliveries WHERE subscription_id = %s ORDER BY id",
        (sid,)).fetchall()]


async def test_recovery_after_an_outage(api: Api) -> None:
    sub = await api.create("invoice.create")
    sid = sub["id"]
    outage = Outage()
    api.receiver.behaviour = outage
    base = f"/api/v1/webhooks/{sid}"
    with psycopg.connect(api.db_url, autocommit=True) as conn:
        began = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        async with running_worker(api.db_url, retry_schedule=(0.05, 0.05),
                                  per_target_concurrency=1):
            for n in range(6):
                add_invoice(conn, f"OUT-{n}")
            await poll(lambda: statuses(conn, sid) == ["failed"] * 6, timeout=20,
                       what="six deliveries failed after the retry schedule")

            # What an integrator sees: six failed deliveries, each tried three times.
            response = await api.request("GET", f"{base}/deliveries?status=failed")
            failed = response.json()
            assert len(failed) == 6
            assert all(d["attempts"] == 3 and d["last_status"] == 503 for d in failed)
            ids = sorted(d["id"] for d in failed)
            response = await api.request("GET", f"{base}/deliveries/{ids[0]}")
            log = response.json()["attempt_log"]
            assert [(a["attempt"], a["status"]) for a in log] == [(1, 503), (2, 503), (3, 503)]
            assert log[0]["error"] == "down for maintenance"

            # The target is back; recover everything since the outage began.
            outage.down = False
            response = await api.request("POST", f"{base}/recover",
                                         json={"since": began.isoformat()})
            assert response.status_code == 202, response.text
            assert response.json() == {"requeued": 6}
            await poll(lambda: statuses(conn, sid) == ["succeeded"] * 6, timeout=20,
                       what="the recovered deliveries succeeded")
            # Same ids, in event order.
            assert outage.taken == ids
            response = await api.request("GET", f"{base}/deliveries/{ids[0]}")
            one = response.json()
            assert [a["status"] for a in one["attempt_log"]] == [503, 503, 503, 200]
            assert one["attempts"] == 1 and one["last_status"] == 200
            assert one["status"] == "succeeded" and one["next_attempt_at"] is None

            # Nothing failed is left in the window.
            response = await api.request("POST", f"{base}/recover",
                                         json={"since": began.isoformat(),
                                               "until": "2999-01-01T00:00:00Z"})
            assert response.json() == {"requeued": 0}

            # Redeliver one that succeeded: same id, sent again.
            response = await api.request("POST", f"{base}/deliveries/{ids[2]}/redeliver")
            assert response.status_code == 202, response.text
            again = response.json()
            assert again["id"] == ids[2] and again["status"] == "pending"
            assert again["attempts"] == 0 and again["finished_at"] is None
            assert again["next_attempt_at"] is not None
            await poll(lambda: outage.taken == [*ids, ids[2]], what="the redelivery")
            await poll(lambda: statuses(conn, sid) == ["succeeded"] * 6, what="recorded")

    # Inactive: both answer 409 and change nothing.
    await api.request("PUT", base, json={"active": False})
    response = await api.request("POST", f"{base}/deliveries/{ids[0]}/redeliver")
    assert_error(response, 409, "inactive")
    response = await api.request("POST", f"{base}/recover", json={"since": began.isoformat()})
    assert_error(response, 409, "inactive")
    assert api.sql("SELECT count(*) FROM webhooks.deliveries WHERE status <> 'succeeded'"
                   ) == [(0,)]


@pytest.mark.parametrize(("body", "fragment"), [
    (b"", "request body is empty"),
    (b"[]", "must be a JSON object"),
    (b"{}", "missing field 'since'"),
    (b'{"since": 3}', "field 'since' must be a string"),
    (b'{"since": "monday"}', "since must be an RFC 3339 timestamp"),
    (b'{"since": "2026-01-01T00:00:00"}', "time zone"),
    (b'{"since": "2026-01-01T00:00:00Z", "until": "2025-01-01T00:00:00Z"}',
     "until must be later than since"),
    (b'{"since": "2026-01-01T00:00:00Z", "status": "failed"}', "unknown field 'status'"),
])
async def test_recover_bad_bodies_are_400(api: Api, body: bytes, fragment: str) -> None:
    sub = await api.create("invoice.create")
    response = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/recover", content=body,
                                 headers={**api.auth(), "Content-Type": "application/json"})
    assert_error(response, 400, fragment)


def seed(conn: psycopg.Connection, sid: int, status: str, created: str) -> int:
    # The partitions of a day in the past, which the service itself never writes to.
    conn.execute("SELECT webhooks.ensure_partitions(%s::timestamptz, %s::timestamptz)",
                 (created, created))
    row = conn.execute(
        "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
        " VALUES (nextval('webhooks.event_ids'), 'invoices', 'invoice.create', now(), '{}')"
        " RETURNING id)"
        " INSERT INTO webhooks.deliveries (event_id, subscription_id, status, attempts,"
        " created_at, next_attempt_at, lease_expires_at, finished_at)"
        " SELECT e.id, %s, %s, 3, %s::timestamptz, now() + interval '1 hour',"
        " CASE WHEN %s = 'pending' THEN now() + interval '1 hour' END,"
        " CASE WHEN %s <> 'pending' THEN now() END FROM e RETURNING id",
        (sid, status, created, status, status)).fetchone()
    assert row is not None
    return int(row[0])


def test_sql_recover_takes_the_failed_ones_of_the_window(conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn)
    other, _ = subscribe(conn)
    before = seed(conn, sid, "failed", "2026-01-01T00:00:00Z")
    first = seed(conn, sid, "failed", "2026-01-02T00:00:00Z")
    done = seed(conn, sid, "succeeded", "2026-01-02T01:00:00Z")
    second = seed(conn, sid, "failed", "2026-01-02T02:00:00Z")
    at_until = seed(conn, sid, "failed", "2026-01-03T00:00:00Z")
    elsewhere = seed(conn, other, "failed", "2026-01-02T00:00:00Z")
    [(count,)] = conn.execute(
        "SELECT webhooks.recover(%s, '2026-01-02T00:00:00Z', '2026-01-03T00:00:00Z')",
        (sid,)).fetchall()
    assert count == 2
    rows = conn.execute(
        "SELECT id, status, attempts, next_attempt_at <= now(), lease_expires_at, finished_at"
        " FROM webhooks.deliveries WHERE status = 'pending' ORDER BY next_attempt_at, id"
    ).fetchall()
    assert rows == [(first, "pending", 0, True, None, None),
                    (second, "pending", 0, True, None, None)]
    assert {r[0]: r[1] for r in conn.execute(
        "SELECT id, status FROM webhooks.deliveries").fetchall()} == {
        before: "failed", first: "pending", done: "succeeded", second: "pending",
        at_until: "failed", elsewhere: "failed"}
    # Without until: everything failed since.
    [(count,)] = conn.execute("SELECT webhooks.recover(%s, '2025-01-01T00:00:00Z', NULL)",
                              (sid,)).fetchall()
    assert count == 2


def test_sql_redeliver_whatever_the_status(conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn)
    for status in ("succeeded", "failed", "pending"):
        did = seed(conn, sid, status, "2026-01-01T00:00:00Z")
        assert conn.execute("SELECT webhooks.redeliver(%s)", (did,)).fetchall() == [(did,)]
        row = conn.execute(
            "SELECT status, attempts, next_attempt_at <= now(), lease_expires_at, finished_at"
            " FROM webhooks.deliveries WHERE id = %s", (did,)).fetchone()
        assert row == ("pending", 0, True, None, None), status


def test_sql_errors_name_the_problem(conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn)
    did = seed(conn, sid, "failed", "2026-01-01T00:00:00Z")
    with pytest.raises(psycopg.errors.NoDataFound, match="no delivery with id 987654"):
        conn.execute("SELECT webhooks.redeliver(987654)")
    with pytest.raises(psycopg.errors.NoDataFound, match="no subscription with id 987654"):
        conn.execute("SELECT webhooks.recover(987654, now() - interval '1 day', NULL)")
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="since"):
        conn.execute("SELECT webhooks.recover(%s, NULL, NULL)", (sid,))
    conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s", (sid,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="inactive"):
        conn.execute("SELECT webhooks.redeliver(%s)", (did,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="inactive"):
        conn.execute("SELECT webhooks.recover(%s, '2020-01-01Z', NULL)", (sid,))
    assert conn.execute("SELECT status FROM webhooks.deliveries WHERE id = %s",
                        (did,)).fetchone() == ("failed",)


def test_functions_are_not_public(conn: psycopg.Connection) -> None:
    rows = conn.execute(
        "SELECT p.proname, p.proacl::text[], p.proconfig FROM pg_proc p"
        " WHERE p.pronamespace = 'webhooks'::regnamespace"
        " AND p.proname IN ('redeliver', 'recover') ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == ["recover", "redeliver"]
    for name, acl, config in rows:
        assert acl is not None and not any(a.startswith("=") for a in acl), (name, acl)
        assert config == ["search_path=pg_catalog, pg_temp"], (name, config)
    role = f"webhooks_probe_{uuid.uuid4().hex[:10]}"
    conn.execute(f"CREATE ROLE {role}".encode())
    try:
        for signature in ("redeliver(bigint)", "recover(bigint, timestamptz, timestamptz)"):
            [(allowed,)] = conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')",
                                        (role, f"webhooks.{signature}")).fetchall()
            assert allowed is False, signature
    finally:
        conn.execute(f"DROP ROLE {role}".encode())


def test_iso_timestamps_of_python_are_accepted() -> None:
    from service.api.deliveries import parse_time

    assert parse_time("since", "2026-11-20T08:00:00Z") == datetime.fromisoformat(
        "2026-11-20T08:00:00+00:00")
    assert parse_time("since", "2026-11-20T08:00:00.123456+01:00").utcoffset() is not None
