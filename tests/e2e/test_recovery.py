"""Redelivery and recovery: an outage (a receiver answering 503) exhausts
the retry schedule, recover brings the failed deliveries back, and they succeed with the
same ids, in event order; the API's answers to bad bodies. The SQL functions underneath,
their errors and their rights: tests/db/test_recovery.py."""

from __future__ import annotations

import psycopg
from aiohttp import web

from tests.support.api import Api, assert_error
from tests.support.receivers import Received, echo_secret
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


async def test_recover_bad_bodies_are_400(api: Api) -> None:
    # Each field's errors: tests/unit/test_bodies.py.
    cases: list[tuple[bytes, str]] = [
        (b"", "request body is empty"),
        (b"{}", "missing field 'since'"),
        (b'{"since": "monday"}', "field 'since' must be an RFC 3339 timestamp"),
        (b'{"since": "2026-01-01T00:00:00"}', "with a time zone"),
        (b'{"since": "2026-01-01T00:00:00Z", "until": "2025-01-01T00:00:00Z"}',
         "until must be later than since"),
        (b'{"since": "2026-01-01T00:00:00Z", "until": "2026-01-01T01:00:00+01:00"}',
         "until must be later than since"),
    ]
    sub = await api.create("invoice.create")
    for body, fragment in cases:
        response = await api.request("POST", f"/api/v1/webhooks/{sub['id']}/recover",
                                     content=body,
                                     headers={**api.auth(), "Content-Type": "application/json"})
        assert_error(response, 400, fragment)
