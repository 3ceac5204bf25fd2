"""Upgrades: a database migrated by each earlier release of main, with an attached table,
rows, a subscription, changes waiting for fan-out and deliveries waiting to be sent, is
upgraded by today's `migrate`: nothing is lost, what waited is delivered, and its schema
and capture function are those of a fresh install.

Each release's migrations/ is a prefix of today's: migrations never change once they are
on main (tests/db/test_schema.py keeps their checksums), so a database at a release is built
by applying today's files up to that release's last one with yoyo alone, which is what
that release's `migrate` did (its functions are the ones its migrations defined).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from service import db
from tests.conftest import new_database
from tests.support.receivers import Receiver
from tests.support.schema import dump_schema, migrate_to
from tests.support.worker import running_worker

# The last migration of each earlier release of main (the commit that ended each round of
# development), oldest first.
RELEASES = {
    "329cda6": "0001.initial",
    "af7ebf7": "0004.failure-lifecycle",
    "a754514": "0007.backfill",
}

# What an application and its DBA had: a table attached with the interface every release
# has, with a tenant column.
APPLICATION = """
CREATE TABLE public.items (id bigint PRIMARY KEY, tenant_id text NOT NULL, name text);
SELECT webhooks.attach('public.items', 'items', 'item', tenant_column => 'tenant_id');
"""

# Rows kept one for one (hook_events also gains the service's own events of migration 0004).
COUNTED = ("webhooks.attachments", "webhooks.subscriptions",
           "webhooks.tokens", "webhooks.events", "webhooks.deliveries", "public.items")


@pytest.fixture
def new_db() -> Iterator[str]:
    """A second empty database, for the fresh install an upgrade is compared with."""
    with new_database("webhooks_fresh") as url:
        yield url


def counts(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {
        table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
        for table in COUNTED}
    kept["item events"] = conn.execute("SELECT array_agg(event ORDER BY event)"
                                       " FROM webhooks.hook_events WHERE resource = 'items'"
                                       ).fetchone()[0]  # type: ignore[index]
    return kept


def populate(conn: psycopg.Connection[Any], target: str) -> int:
    """The application's table, a subscription to it, two captured changes not fanned out
    yet and one delivery waiting to be sent (an event written as a worker of the release
    wrote it); returns the subscription's id."""
    conn.execute(APPLICATION)
    conn.execute("INSERT INTO webhooks.tokens (owner, token_hash) VALUES ('acme', '\\x01')")
    sid = conn.execute(
        "INSERT INTO webhooks.subscriptions (owner, resource, events, target, secret)"
        " VALUES ('acme', 'items', '{item.create,item.update}', %s,"
        " 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw') RETURNING id", (target,)).fetchone()[0]
    conn.execute("INSERT INTO public.items VALUES (1, 't1', 'one'), (2, 't2', 'two')")
    conn.execute("UPDATE public.items SET name = 'uno' WHERE id = 1")
    event = conn.execute("SELECT nextval('webhooks.event_ids')").fetchone()[0]
    body = {"event": {"id": event, "name": "item.create", "resource": "items"},
            "resource": {"id": 9, "tenant_id": "t9", "name": "nine"}}
    conn.execute("INSERT INTO webhooks.events (id, hook_resource, name, tenant, occurred_at,"
                 " body) VALUES (%s, 'items', 'item.create', 't9', now(), %s)",
                 (event, json.dumps(body)))
    conn.execute("INSERT INTO webhooks.deliveries (event_id, subscription_id) VALUES (%s, %s)",
                 (event, sid))
    return sid


def fresh_with_application(url: str) -> None:
    db.migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(APPLICATION)


def capture_function(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_get_functiondef(format('webhooks.capture_%s', a.id)::regproc)"
                       " FROM webhooks.attachments a WHERE a.table_oid = 'public.items'::regclass"
                       ).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize("release", list(RELEASES))
async def test_an_earlier_release_upgrades_to_today(release: str, empty_db: str,
                                                    new_db: str) -> None:
    migrate_to(empty_db, RELEASES[release])
    async with Receiver() as receiver:
        with psycopg.connect(empty_db, autocommit=True) as conn:
            populate(conn, receiver.url)
            before = counts(conn)

        assert db.migrate(empty_db) == [m for m in sorted(p.stem for p in
                                                          db.MIGRATIONS_DIR.glob("*.sql"))
                                        if m > RELEASES[release]]

        # The schema, and the attached table's capture function, are a fresh install's.
        fresh_with_application(new_db)
        assert dump_schema(empty_db) == dump_schema(new_db)
        with psycopg.connect(empty_db, autocommit=True) as conn, \
                psycopg.connect(new_db, autocommit=True) as fresh:
            assert capture_function(conn) == capture_function(fresh)
            # ... and the table attached earlier gains its truncate event.
            assert counts(conn) == {**before, "item events": sorted(
                {*before["item events"], "item.truncate"})}

            # What waited is delivered: the delivery, the two captured changes, and a
            # change made after the upgrade.
            async with running_worker(empty_db):
                conn.execute("INSERT INTO public.items VALUES (3, 't3', 'three')")
                await receiver.wait_for(lambda r: len(r.deliveries()) >= 5, timeout=20)
        got = sorted((b["event"]["name"], b["resource"]["id"])
                     for b in (json.loads(r.body) for r in receiver.deliveries()))
        assert got == [("item.create", 1), ("item.create", 2), ("item.create", 3),
                       ("item.create", 9), ("item.update", 1)]
