"""`webhooks deliveries list|show|redeliver` and `webhooks recover`: the operator's delivery
log and recovery, through the same SQL functions as the REST API."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
import pytest

from service.commands.cli import main
from tests.support.subscriptions import subscribe

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> Cli:
    """Runs `webhooks ...` in this process against the test database: (code, out, err)."""
    monkeypatch.setenv("DATABASE_URL", db_url)

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0) if not isinstance(exc.code, str) else 2
        out, err = capsys.readouterr()
        return code, out, err

    return run


def seed(conn: psycopg.Connection, sid: int, status: str, created: str,
         name: str = "invoice.create") -> int:
    # The partitions of a day in the past, which the service itself never writes to.
    conn.execute("SELECT webhooks.ensure_partitions(%s::timestamptz, %s::timestamptz)",
                 (created, created))
    row = conn.execute(
        "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
        " VALUES (nextval('webhooks.event_ids'), 'invoices', %s, now(),"
        " '{\"event\": {\"name\": \"x\"}, \"resource\": {\"number\": \"N-1\"}}') RETURNING id)"
        " INSERT INTO webhooks.deliveries (event_id, subscription_id, status, attempts,"
        " created_at, finished_at)"
        " SELECT e.id, %s, %s, 3, %s::timestamptz,"
        " CASE WHEN %s <> 'pending' THEN now() END FROM e RETURNING id",
        (name, sid, status, created, status)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("argv", [
    ("deliveries", "--help"), ("deliveries", "list", "--help"),
    ("deliveries", "show", "--help"), ("deliveries", "redeliver", "--help"),
    ("recover", "--help"),
])
def test_help(cli: Cli, argv: tuple[str, ...]) -> None:
    code, out, _ = cli(*argv)
    assert code == 0
    assert out.startswith("usage: webhooks ")
    assert len(out.splitlines()) > 3


def test_list_show_redeliver_recover(cli: Cli, conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn)
    old = seed(conn, sid, "failed", "2026-01-01T00:00:00Z")
    ok = seed(conn, sid, "succeeded", "2026-01-02T00:00:00Z", "invoice.update")
    new = seed(conn, sid, "failed", "2026-01-03T00:00:00Z")
    conn.execute("INSERT INTO webhooks.attempts (delivery_id, subscription_id, attempt,"
                 " attempted_at, status, duration_ms, error)"
                 " VALUES (%s, %s, 1, now(), 503, 12.5, 'down')", (new, sid))

    code, out, _ = cli("deliveries", "list", str(sid))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["id", "event", "status", "tries"]
    assert [int(line.split()[0]) for line in lines[1:]] == [new, ok, old]
    assert lines[1].split()[1:5] == ["invoice.create", "failed", "3", "503"]

    code, out, _ = cli("deliveries", "list", str(sid), "--status", "failed", "--limit", "1")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[1:]] == [str(new), "(more"]
    assert f"--before {new}" in out

    code, out, _ = cli("deliveries", "show", str(new))
    assert code == 0
    shown = json.loads(out)
    assert shown["id"] == new and shown["subscription_id"] == sid
    assert shown["payload"]["resource"] == {"number": "N-1"}
    assert [(a["attempt"], a["status"], a["error"]) for a in shown["attempt_log"]] == [
        (1, 503, "down")]

    code, out, _ = cli("deliveries", "redeliver", str(ok))
    assert code == 0 and f"delivery {ok} is pending again" in out
    code, out, _ = cli("recover", str(sid), "--since", "2026-01-02T00:00:00Z")
    assert code == 0 and "requeued 1 failed delivery" in out
    statuses: dict[int, str] = dict(
        conn.execute("SELECT id, status FROM webhooks.deliveries").fetchall())
    assert statuses == {old: "failed", ok: "pending", new: "pending"}
    code, out, _ = cli("recover", str(sid), "--since", "2025-01-01T00:00:00+00:00",
                       "--until", "2026-01-02T00:00:00Z")
    assert code == 0 and "requeued 1 failed delivery" in out


def test_errors(cli: Cli, conn: psycopg.Connection) -> None:
    sid, _ = subscribe(conn)
    did = seed(conn, sid, "failed", "2026-01-01T00:00:00Z")
    code, _, err = cli("deliveries", "show", "424242")
    assert code == 1 and "no delivery with id 424242" in err
    code, _, err = cli("deliveries", "redeliver", "424242")
    assert code == 1 and "no delivery with id 424242" in err
    code, _, err = cli("deliveries", "list", "424242")
    assert code == 1 and "no subscription with id 424242" in err
    code, _, err = cli("recover", "424242", "--since", "2026-01-01T00:00:00Z")
    assert code == 1 and "no subscription with id 424242" in err
    code, _, err = cli("recover", str(sid), "--since", "2026-01-01T00:00:00")
    assert code == 2 and "time zone" in err
    code, _, err = cli("recover", str(sid))
    assert code == 2 and "--since" in err
    conn.execute("UPDATE webhooks.subscriptions SET active = false WHERE id = %s", (sid,))
    code, _, err = cli("deliveries", "redeliver", str(did))
    assert code == 1 and "inactive" in err
    code, _, err = cli("recover", str(sid), "--since", "2020-01-01T00:00:00Z")
    assert code == 1 and "inactive" in err
    assert conn.execute("SELECT status FROM webhooks.deliveries").fetchall() == [("failed",)]


def test_list_says_a_parked_delivery_waits_behind_an_earlier_one(
        cli: Cli, conn: psycopg.Connection) -> None:
    """A strict subscription's delivery parked behind its head shows no time but why."""
    sid, _ = subscribe(conn)
    head = seed(conn, sid, "pending", "2026-11-20 09:00Z")
    parked = seed(conn, sid, "pending", "2026-11-20 09:01Z")
    conn.execute("UPDATE webhooks.deliveries SET next_attempt_at = 'infinity' WHERE id = %s",
                 (parked,))
    code, out, _ = cli("deliveries", "list", str(sid))
    assert code == 0
    lines = {int(line.split()[0]): line for line in out.splitlines()[1:]}
    assert lines[parked].endswith("behind an earlier one")
    assert not lines[head].endswith("behind an earlier one")
