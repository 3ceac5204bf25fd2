"""What the commands print that came from the database (a table's name, a target, an owner,
an error, a payload) reaches the terminal with its control characters escaped: a table
named with ESC and BEL sequences must not retitle, clear or recolour the operator's
terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg

from tests.db.test_cli_deliveries import seed

# ESC ] 0 ; ... BEL retitles the terminal, ESC [ 2 J clears it, CSI (C1) and DEL, and a
# right-to-left override that would show the rest of a line reversed.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b31m\x7f\u202e"
ESCAPED = "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\x7f\\u202e"
RAW = ("\x1b", "\x07", "\x9b", "\x7f", "\u202e")


def webhooks(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service", *argv],
                          env={**os.environ, "DATABASE_URL": url}, capture_output=True,
                          text=True, timeout=60)


def assert_escaped(text: str) -> None:
    assert not any(c in text for c in RAW), ascii(text)
    assert ESCAPED in text, text


def test_status_escapes_table_names_targets_owners_and_reasons(
        db_url: str, conn: psycopg.Connection) -> None:
    table = f"inv{HOSTILE}"
    conn.execute(f'CREATE TABLE public."{table}" (id bigint PRIMARY KEY, note text)')
    conn.execute("SELECT webhooks.attach(%s::regclass, resource => 'hostile', noun => 'hostile')",
                 (f'public."{table}"',))
    conn.execute("""
        INSERT INTO webhooks.subscriptions (owner, resource, events, target, secret, active,
                                            last_status, last_failure_at, last_failure_content,
                                            inactive_reason)
        VALUES (%(h)s, 'hostile', '{hostile.create}', 'http://a.example/' || %(h)s, 's', false,
                500, now(), %(h)s, 'stopped: ' || %(h)s)""", {"h": HOSTILE})
    done = webhooks(db_url, "status")
    assert done.returncode == 0, done.stderr
    assert_escaped(done.stdout)
    assert f"inv{ESCAPED}" in done.stdout  # the table's name, escaped, not left out
    # JSON keeps the values, every control character written as \uXXXX.
    done = webhooks(db_url, "status", "--json")
    assert done.returncode == 0, done.stderr
    assert not any(c in done.stdout for c in RAW), ascii(done.stdout)
    data = json.loads(done.stdout)
    assert any(HOSTILE in a["table"] for a in data["attachments"])


def test_tokens_deliveries_and_payloads_are_printed_escaped(
        db_url: str, conn: psycopg.Connection) -> None:
    done = webhooks(db_url, "token", "create", "--owner", f"eve{HOSTILE}")
    assert done.returncode == 0, done.stderr
    assert_escaped(done.stdout)
    done = webhooks(db_url, "token", "list")
    assert done.returncode == 0, done.stderr
    assert_escaped(done.stdout)

    sid = conn.execute(
        "INSERT INTO webhooks.subscriptions (owner, resource, events, target, secret)"
        " VALUES ('o', 'invoices', '{invoice.create}', 'http://a.example/', 's')"
        " RETURNING id").fetchone()[0]  # type: ignore[index]
    delivery = seed(conn, sid, "failed", "2026-01-05T10:00:00Z", name=f"invoice.{HOSTILE}")
    conn.execute("UPDATE webhooks.events SET body = jsonb_build_object('note', %s::text,"
                 " 'amount', 1.00) WHERE id = (SELECT event_id FROM webhooks.deliveries"
                 " WHERE id = %s)", (HOSTILE, delivery))
    done = webhooks(db_url, "deliveries", "list", str(sid))
    assert done.returncode == 0, done.stderr
    assert_escaped(done.stdout)
    done = webhooks(db_url, "deliveries", "show", str(delivery))
    assert done.returncode == 0, done.stderr
    assert not any(c in done.stdout for c in RAW), ascii(done.stdout)
    shown = json.loads(done.stdout)
    assert shown["payload"]["note"] == HOSTILE  # the same value, written escaped
    assert '"amount": 1.00' in done.stdout  # and the payload's text as sent


def test_database_errors_are_printed_escaped(db_url: str, conn: psycopg.Connection) -> None:
    # An error whose message quotes a name from the database: the CLI prints its first line.
    conn.execute("CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS"
                 " $$ BEGIN RAISE EXCEPTION 'refused by %', " + f"'{HOSTILE}'" + "; END $$")
    conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON webhooks.tokens"
                 " FOR EACH ROW EXECUTE FUNCTION public.refuse()")
    done = webhooks(db_url, "token", "create", "--owner", "o")
    assert done.returncode == 1
    assert "the database refused: refused by" in done.stderr
    assert_escaped(done.stderr)
