"""A managed PostgreSQL is enough: a service role that owns the database and may create
roles, but is no superuser, migrates, attaches a table an application role writes to, and
delivers its changes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from service import db
from tests.conftest import SERVER_URL
from tests.support.receivers import Receiver
from tests.support.subscriptions import subscribe
from tests.support.worker import running_worker


def as_role(url: str, role: str) -> str:
    """`url` with `role` as its user (trust authentication, no password)."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{role}@{host}{port}", parts.path, parts.query,
                       parts.fragment))


@pytest.fixture
def service_role(empty_db: str) -> Iterator[str]:
    """A CREATEROLE, non-superuser role that owns the empty database; its URL."""
    role = f"svc_{uuid.uuid4().hex[:8]}"
    dbname = urlsplit(empty_db).path.lstrip("/")
    with psycopg.connect(SERVER_URL, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN CREATEROLE NOSUPERUSER")
        conn.execute(f"ALTER DATABASE {dbname} OWNER TO {role}")
    try:
        yield as_role(empty_db, role)
    finally:
        with psycopg.connect(SERVER_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
            for (name,) in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s",
                                        (f"app_{role}%",)).fetchall():
                conn.execute(f"DROP ROLE {name}")
            conn.execute(f"DROP ROLE {role}")


async def test_a_createrole_owner_migrates_attaches_and_delivers(service_role: str) -> None:
    app = f"app_{urlsplit(service_role).username}"
    with psycopg.connect(service_role, autocommit=True) as conn:
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                            ).fetchone() == (False,)
    assert db.migrate(service_role)  # warns that event triggers need a superuser
    async with Receiver() as receiver:
        with psycopg.connect(service_role, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {app} LOGIN")
            conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, total numeric)")
            conn.execute(f"GRANT SELECT, INSERT, UPDATE ON public.orders TO {app}")
            conn.execute("SELECT webhooks.attach('public.orders', 'orders', 'order')")
            subscribe(conn, receiver.url, resource="orders",
                      events=["order.create", "order.update"])
            async with running_worker(service_role):
                # The application's own role, with no rights on schema webhooks, writes.
                with psycopg.connect(as_role(service_role, app), autocommit=True) as writer:
                    assert writer.execute(
                        "SELECT has_schema_privilege('webhooks', 'USAGE')").fetchone() == \
                        (False,)
                    writer.execute("INSERT INTO public.orders VALUES (1, 9.50)")
                    writer.execute("UPDATE public.orders SET total = 10 WHERE id = 1")
                await receiver.wait_for(lambda r: len(r.deliveries()) >= 2, timeout=20)
    bodies = [json.loads(r.body) for r in receiver.deliveries()]
    assert sorted((b["event"]["name"], b["resource"]["total"]) for b in bodies) == \
        [("order.create", 9.5), ("order.update", 10)]
    assert {b["event"]["user_id"] for b in bodies} == {app}
