"""The store's subscription methods (service/store/api.py, rotation.py, tokens.py and their
queries in sql/queries/api.sql, rotation.sql, tokens.sql), called directly against the
test's database: create under the owner's cap, count, list (filters, pages, the byte
budget), get, lock, (de)activate, delete (and what goes with it), move to a new target,
rotate the secret, look a token up, and the events registry the API checks events against.

Every subscription query is scoped by owner, and by tenant when the token has one: another
owner's or tenant's id must read exactly like an id that never existed, whatever odd (but
NUL-free) strings the owners and tenants are. tests/e2e/test_api_webhooks.py,
test_security_api.py, test_api_create.py and test_rotate_secret.py show the same through
HTTP; these pin the layer underneath, so that a broken query fails here first."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from service import db, filters, tokens
from service.store import Store, StoreRejected
from tests.support.subscriptions import NOWHERE, subscribe, subscription

# Owners and tenants an attacker might pick to reach another's rows: case, spaces, LIKE
# wildcards, quotes, backslashes, zero-width and combining characters, a prefix. NUL-free
# (PostgreSQL's text cannot hold NUL; the API refuses it earlier).
ODD = ["Alice", "alice ", " alice", "alic%", "alic_", "al'ice", 'al"ice', "al\\ice",
       "alice\u200b", "alice\u0301", "alic", "alice\n", "%", "_"]


def token(conn: psycopg.Connection[Any], owner: str, tenant: str | None = None) -> bytes:
    """The hash (as the API looks it up) of a new token of `owner` (and `tenant`)."""
    _, text = tokens.create(conn, owner, tenant)
    return tokens.hash_token(text)


def token_id(conn: psycopg.Connection[Any], digest: bytes) -> int:
    row = conn.execute("SELECT id FROM webhooks.tokens WHERE token_hash = %s",
                       (digest,)).fetchone()
    assert row is not None
    return int(row[0])


def sub(conn: psycopg.Connection[Any], owner: str = "alice", tenant: str | None = None,
        **kwargs: Any) -> int:
    """The id of a new subscription of `owner` (and `tenant`), inserted directly."""
    return subscribe(conn, owner=owner, tenant=tenant, **kwargs)[0]


def page_ids(row: tuple[Any, ...]) -> list[int]:
    """The ids of a list_subscriptions page, in its order."""
    return [s["id"] for s in json.loads(row[4])]


async def create(store: Store, owner: str = "alice", tenant: str | None = None, *,
                 max: int = 10, target: str = NOWHERE, secret: str = "whsec_test",
                 **kwargs: Any) -> dict[str, Any] | None:
    """insert_subscription as the API runs it: under the owner's lock, in a transaction."""
    async with store.transaction() as s:
        await s.lock_owner(owner=owner)
        args: dict[str, Any] = {"resource": "invoices", "events": ["invoice.create"],
                                "filter": None, "filter_path": None, "ordering": "unordered"}
        args.update(kwargs)
        return await s.insert_subscription(owner=owner, tenant=tenant, target=target,
                                           secret=secret, max=max, **args)


async def page(store: Store, digest: bytes, *, resource: str | None = None,
               active: bool | None = None, after: int = 0, limit: int = 100,
               max_bytes: int = 1 << 20) -> tuple[Any, ...]:
    row = await store.list_subscriptions(token_hash=digest, resource=resource, active=active,
                                         after=after, limit=limit, max_bytes=max_bytes)
    assert row is not None
    return row


def bucket(conn: psycopg.Connection[Any], sid: int) -> int | None:
    """The rate of the subscription's rate bucket, or None when it has none."""
    row = conn.execute("SELECT rate FROM webhooks.rate_buckets WHERE subscription_id = %s",
                       (sid,)).fetchone()
    return None if row is None else int(row[0])


# --- create and count ----------------------------------------------------------------


async def test_insert_returns_the_doc_get_shows_and_keeps_the_secret_out(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    row = await create(store, tenant="acme", events=["invoice.create", "payment.delete"],
                       secret="whsec_SECRET", rate_limit=7)
    assert row is not None and set(row) == {"id", "doc"}
    assert json.loads(row["doc"]) == {
        "id": row["id"], "resource": "invoices", "events": "invoice.create,payment.delete",
        "target": NOWHERE, "active": True, "inactive_reason": None, "last_status": 200,
        "last_success_at": None, "last_failure_at": None, "last_failure_content": None,
        "filter": None, "ordering": "unordered", "rate_limit": 7}
    assert "whsec_SECRET" not in row["doc"] and "acme" not in row["doc"]
    stored = subscription(conn, row["id"])
    assert (stored["owner"], stored["tenant"], stored["secret"], stored["events"]) == (
        "alice", "acme", "whsec_SECRET", ["invoice.create", "payment.delete"])
    assert bucket(conn, row["id"]) == 7
    got = await store.get_subscription(token_hash=token(conn, "alice", "acme"), id=row["id"])
    assert got is not None and got[4] == row["doc"]


async def test_insert_stores_the_filter_and_its_path(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    wanted = {"status": "paid"}
    path = filters.compile_path(wanted)
    assert path is not None
    row = await create(Store(pool), filter=Jsonb(wanted), filter_path=path, ordering="strict")
    assert row is not None
    doc = json.loads(row["doc"])
    assert (doc["filter"], doc["ordering"]) == (wanted, "strict") and "rate_limit" not in doc
    # Stored as a jsonpath: read back in PostgreSQL's spelling of it.
    spelt = conn.execute("SELECT %s::jsonpath::text", (path,)).fetchone()
    assert spelt is not None
    read = Store(pool).subscription_filter_path
    assert await read(id=row["id"], owner="alice", tenant=None) == spelt[0]
    # Another owner's or tenant's subscription has none to them.
    for owner, tenant in (("mallory", None), ("alice", "acme")):
        assert await read(id=row["id"], owner=owner, tenant=tenant) is None


async def test_insert_stops_at_the_cap_which_counts_every_tenant_of_the_owner_only(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    sub(conn, "alice", None)
    sub(conn, "alice", "acme")
    for other in ("mallory", *ODD):
        sub(conn, other)
    assert await store.count_subscriptions(owner="alice") == 2
    assert await create(store, "alice", "globex", max=2) is None
    assert await create(store, "alice", None, max=2) is None
    assert await store.count_subscriptions(owner="alice") == 2
    # Other owners' rows, however alike their names, take none of alice's room.
    assert await create(store, "alice", "globex", max=3) is not None
    assert await store.count_subscriptions(owner="alice") == 3
    assert await create(store, "alice", max=3) is None
    for other in ("mallory", *ODD):
        assert await store.count_subscriptions(owner=other) == 1, other
    assert await store.count_subscriptions(owner="nobody") == 0


async def test_insert_the_tables_checks_refuse_stores_nothing(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    refused: list[dict[str, Any]] = [
        {"ordering": "random"}, {"ordering": "Strict"}, {"rate_limit": 0},
        {"rate_limit": 10001}, {"rate_limit": -1}, {"events": []}]
    for bad in refused:
        with pytest.raises(StoreRejected) as caught:
            await create(store, **bad)
        assert caught.value.sqlstate == "23514", bad
    assert await store.count_subscriptions(owner="alice") == 0


async def test_lock_owner_serialises_that_owners_creates_only(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    def blocked(owner: str) -> bool:
        """Whether another session's lock_owner(owner) has to wait."""
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '20ms'")
                conn.execute(db.query("api_owner_lock"), {"owner": owner})
        except psycopg.errors.LockNotAvailable:
            return True
        return False

    async with Store(pool).transaction() as s:
        await s.lock_owner(owner="alice")
        assert blocked("alice")
        for other in ("bob", *ODD):
            assert not blocked(other), other
    assert not blocked("alice")


# --- list -------------------------------------------------------------------------------


async def test_list_gives_the_token_then_the_page_oldest_first(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    digest = token(conn, "alice", "acme")
    ids = [sub(conn, "alice", "acme") for _ in range(3)]
    row = await page(store, digest)
    assert row[:4] == (token_id(conn, digest), "alice", "acme", digest)
    docs = [subscription(conn, i)["doc"] for i in ids]
    assert row[4] == "[" + ",".join(docs) + "]"
    assert (row[5], row[6]) == (ids[-1], False)
    empty = await page(store, token(conn, "bob"))
    assert empty[1:] == ("bob", None, empty[3], "[]", None, False)


async def test_list_filters_by_resource_and_active(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    digest = token(conn, "alice")
    on = sub(conn)
    off = sub(conn, active=False)
    pay = sub(conn, resource="payments", events=["payment.create"])
    assert page_ids(await page(store, digest)) == [on, off, pay]
    assert page_ids(await page(store, digest, active=True)) == [on, pay]
    assert page_ids(await page(store, digest, active=False)) == [off]
    assert page_ids(await page(store, digest, resource="invoices")) == [on, off]
    assert page_ids(await page(store, digest, resource="invoices", active=False)) == [off]
    assert page_ids(await page(store, digest, resource="payments", active=False)) == []
    for odd in ("INVOICES", "invoices ", "invoice%", "%", ""):
        assert page_ids(await page(store, digest, resource=odd)) == [], odd


async def test_list_pages_by_after_and_limit_see_every_row_once(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    digest = token(conn, "alice")
    ids = []
    for _ in range(5):
        ids.append(sub(conn))
        sub(conn, "mallory")  # interleaved: another owner's ids between alice's
    first = await page(store, digest, limit=2)
    assert (page_ids(first), first[5], first[6]) == (ids[:2], ids[1], True)
    second = await page(store, digest, limit=2, after=first[5])
    assert (page_ids(second), second[5], second[6]) == (ids[2:4], ids[3], True)
    third = await page(store, digest, limit=2, after=second[5])
    assert (page_ids(third), third[5], third[6]) == (ids[4:], ids[4], False)
    exact = await page(store, digest, limit=5)
    assert (page_ids(exact), exact[6]) == (ids, False)
    past = await page(store, digest, after=ids[-1])
    assert past[4:] == ("[]", None, False)
    # `after` need not be one of the caller's ids: an id between them starts after it.
    assert page_ids(await page(store, digest, after=ids[2] + 1)) == ids[3:]


async def test_list_byte_budget_still_holds_one_row_a_page(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    digest = token(conn, "alice")
    ids = [sub(conn) for _ in range(3)]
    seen, after, more = [], 0, True
    while more:
        row = await page(store, digest, after=after, max_bytes=1)
        assert len(page_ids(row)) == 1
        seen += page_ids(row)
        after, more = row[5], row[6]
    assert seen == ids
    # A budget of exactly the first two docs and their separators keeps them and the
    # third row that passes it; one byte less stops after the second.
    two = sum(len(subscription(conn, i)["doc"].encode()) + 1 for i in ids[:2])
    assert page_ids(await page(store, digest, max_bytes=two)) == ids
    assert page_ids(await page(store, digest, max_bytes=two - 1)) == ids[:2]


async def test_list_is_scoped_to_the_owner_and_the_tokens_tenant(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    untenanted, acme, globex = sub(conn), sub(conn, tenant="acme"), sub(conn, tenant="globex")
    odd_tenants = []
    for odd in ODD:
        sub(conn, odd)
        odd_tenants.append(sub(conn, "alice", odd))
    # A token without a tenant sees all its owner's, whatever their tenants.
    assert page_ids(await page(store, token(conn, "alice"))) == [
        untenanted, acme, globex, *odd_tenants]
    # A tenant's token sees its tenant's only: not the owner's untenanted ones.
    assert page_ids(await page(store, token(conn, "alice", "acme"))) == [acme]
    for odd in ("ACME", "acme ", "acm%", "acm_"):
        assert page_ids(await page(store, token(conn, "alice", odd))) == [], odd
    assert page_ids(await page(store, token(conn, "mallory"))) == []
    assert page_ids(await page(store, token(conn, "mallory", "acme"))) == []
    for odd in ODD:
        row = await page(store, token(conn, odd))
        assert len(page_ids(row)) == 1 and row[1] == odd, odd


async def test_list_and_get_with_an_unknown_or_revoked_token_read_nothing(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    sid = sub(conn)
    digest = token(conn, "alice")
    assert await store.get_subscription(token_hash=digest, id=sid) is not None
    assert tokens.revoke(conn, token_id(conn, digest))
    assert await store.list_subscriptions(token_hash=digest, resource=None, active=None,
                                          after=0, limit=100, max_bytes=1 << 20) is None
    assert await store.get_subscription(token_hash=digest, id=sid) is None
    for unknown in (b"", b"\x00" * 32, tokens.hash_token("wht_" + "A" * 43), digest[:-1]):
        assert await store.list_subscriptions(token_hash=unknown, resource=None, active=None,
                                              after=0, limit=100, max_bytes=1 << 20) is None
        assert await store.get_subscription(token_hash=unknown, id=sid) is None


# --- get, lock ----------------------------------------------------------------------


async def test_get_of_another_owners_or_tenants_id_reads_like_a_missing_one(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    mine, acme, mallorys = sub(conn), sub(conn, tenant="acme"), sub(conn, "mallory")
    missing = max(mine, acme, mallorys) + 1000
    alice, alice_acme = token(conn, "alice"), token(conn, "alice", "acme")
    alice_globex = token(conn, "alice", "globex")

    async def doc(digest: bytes, sid: int) -> str | None:
        row = await store.get_subscription(token_hash=digest, id=sid)
        assert row is not None and row[3] == digest
        return row[4]

    assert await doc(alice, mine) == subscription(conn, mine)["doc"]
    assert await doc(alice, acme) == subscription(conn, acme)["doc"]
    assert await doc(alice_acme, acme) == subscription(conn, acme)["doc"]
    for digest, sid in ((alice, mallorys), (alice_acme, mine), (alice_globex, acme),
                        (alice_globex, mine), (token(conn, "mallory", "acme"), acme)):
        assert await doc(digest, sid) is None, sid
    for odd in ODD:
        assert await doc(token(conn, odd), mine) is None, odd
    for sid in (missing, 0, -1, 2**63 - 1, -(2**63), 2**64):
        assert await doc(alice, sid) is None, sid


async def test_lock_returns_the_callers_row_and_holds_it(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    sid = sub(conn, tenant="acme", active=False)
    async with store.transaction() as s:
        for owner, tenant in (("mallory", None), ("mallory", "acme"), ("alice", "globex"),
                              *((odd, None) for odd in ODD)):
            assert await s.lock_subscription(id=sid, owner=owner, tenant=tenant) is None
        assert await s.lock_subscription(id=sid + 1, owner="alice", tenant=None) is None
        row = await s.lock_subscription(id=sid, owner="alice", tenant="acme")
        assert row is not None
        assert (row["id"], row["resource"], row["active"], row["ordering"]) == (
            sid, "invoices", False, "unordered")
        assert "secret" not in row and "owner" not in row
        # Held until the transaction ends: another session cannot take it.
        with pytest.raises(psycopg.errors.LockNotAvailable):
            conn.execute("SELECT 1 FROM webhooks.subscriptions WHERE id = %s"
                         " FOR UPDATE NOWAIT", (sid,))
    conn.execute("SELECT 1 FROM webhooks.subscriptions WHERE id = %s FOR UPDATE NOWAIT",
                 (sid,))
    # A token without a tenant locks any of its owner's.
    async with store.transaction() as s:
        assert await s.lock_subscription(id=sid, owner="alice", tenant=None) is not None


# --- activate, deactivate -----------------------------------------------------------


async def test_set_active_sets_the_rate_limit_and_its_bucket(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    sid = sub(conn, tenant="acme")
    off = await store.set_subscription_active(id=sid, owner="alice", tenant="acme",
                                              active=False, rate_limit=5)
    assert off is not None and off["id"] == sid
    assert off["doc"] == subscription(conn, sid)["doc"]
    assert (json.loads(off["doc"])["active"], json.loads(off["doc"])["rate_limit"]) == (False, 5)
    assert bucket(conn, sid) == 5
    # As the service holds it: made active again, its inactive_reason goes.
    conn.execute("UPDATE webhooks.subscriptions SET inactive_reason = 'events made private'"
                 " WHERE id = %s", (sid,))
    on = await store.set_subscription_active(id=sid, owner="alice", tenant=None,
                                             active=True, rate_limit=None)
    assert on is not None
    doc = json.loads(on["doc"])
    assert (doc["active"], doc["inactive_reason"], "rate_limit" in doc) == (True, None, False)
    assert bucket(conn, sid) is None
    assert subscription(conn, sid)["active"] is True


async def test_set_active_takes_it_out_of_the_registry_and_back(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    """What the capture triggers read: an inactive subscription is sent nothing."""
    store = Store(pool)
    sid = sub(conn, tenant="acme", events=["invoice.create", "invoice.update"])

    def registry() -> list[tuple[Any, ...]]:
        return conn.execute("SELECT event, resource, tenant FROM webhooks.subscription_events"
                            " WHERE subscription_id = %s ORDER BY event", (sid,)).fetchall()

    both = [("invoice.create", "invoices", "acme"), ("invoice.update", "invoices", "acme")]
    assert registry() == both
    assert await store.set_subscription_active(id=sid, owner="alice", tenant="acme",
                                               active=False, rate_limit=None) is not None
    assert registry() == []
    assert await store.set_subscription_active(id=sid, owner="alice", tenant="acme",
                                               active=True, rate_limit=None) is not None
    assert registry() == both


async def test_set_active_on_another_owners_or_tenants_id_changes_nothing(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    sid = sub(conn, tenant="acme")
    before = subscription(conn, sid)
    for owner, tenant in (("mallory", None), ("mallory", "acme"), ("alice", "globex"),
                          *((odd, None) for odd in ODD), *(("alice", odd) for odd in ODD)):
        assert await store.set_subscription_active(id=sid, owner=owner, tenant=tenant,
                                                   active=False, rate_limit=3) is None
    assert await store.set_subscription_active(id=sid + 1, owner="alice", tenant=None,
                                               active=False, rate_limit=3) is None
    assert subscription(conn, sid) == before and bucket(conn, sid) is None


# --- delete ----------------------------------------------------------------------------


def deliver(conn: psycopg.Connection[Any], sid: int, status: str) -> int:
    """A delivery of a new event to subscription `sid`, with one attempt; its id."""
    row = conn.execute(
        "WITH e AS (INSERT INTO webhooks.events (id, hook_resource, name, occurred_at, body)"
        "           VALUES (nextval('webhooks.event_ids'), 'invoices', 'invoice.create',"
        "                   now(), '{}') RETURNING id)"
        " INSERT INTO webhooks.deliveries (event_id, subscription_id, status, attempts,"
        "                                  finished_at)"
        " SELECT e.id, %s, %s, 1, CASE WHEN %s = 'pending' THEN NULL ELSE now() END FROM e"
        " RETURNING id", (sid, status, status)).fetchone()
    assert row is not None
    conn.execute("INSERT INTO webhooks.attempts (delivery_id, subscription_id, attempt,"
                 " attempted_at, status, duration_ms) VALUES (%s, %s, 1, now(), 500, 1)",
                 (row[0], sid))
    return int(row[0])


def counts(conn: psycopg.Connection[Any], sid: int) -> tuple[int, ...]:
    """(subscriptions, registry rows, deliveries, attempts, rate buckets) of subscription
    `sid`."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM webhooks.subscriptions WHERE id = %(id)s),"
        "       (SELECT count(*) FROM webhooks.subscription_events"
        "         WHERE subscription_id = %(id)s),"
        "       (SELECT count(*) FROM webhooks.deliveries WHERE subscription_id = %(id)s),"
        "       (SELECT count(*) FROM webhooks.attempts WHERE subscription_id = %(id)s),"
        "       (SELECT count(*) FROM webhooks.rate_buckets WHERE subscription_id = %(id)s)",
        {"id": sid}).fetchone()
    assert row is not None
    return tuple(row)


async def test_delete_of_another_owners_or_tenants_id_is_false_and_keeps_it(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    sid = sub(conn, tenant="acme")
    for owner, tenant in (("mallory", None), ("mallory", "acme"), ("alice", "globex"),
                          *((odd, None) for odd in ODD), *(("alice", odd) for odd in ODD)):
        assert not await store.delete_subscription(id=sid, owner=owner, tenant=tenant)
    for missing in (sid + 1, 0, -1, 2**63 - 1):
        assert not await store.delete_subscription(id=missing, owner="alice", tenant=None)
    assert counts(conn, sid)[0] == 1
    assert await store.delete_subscription(id=sid, owner="alice", tenant="acme")
    assert not await store.delete_subscription(id=sid, owner="alice", tenant="acme")


async def test_delete_drops_its_deliveries_and_bucket_keeps_its_attempts_and_others(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    gone, kept = sub(conn), sub(conn)
    conn.execute("UPDATE webhooks.subscriptions SET rate_limit = 4"
                 " WHERE id IN (%s, %s)", (gone, kept))
    for sid in (gone, kept):
        deliver(conn, sid, "pending")
        deliver(conn, sid, "succeeded")
        deliver(conn, sid, "failed")
    assert counts(conn, gone) == counts(conn, kept) == (1, 6, 3, 3, 1)
    assert await store.delete_subscription(id=gone, owner="alice", tenant=None)
    # Its attempts stay until retention drops their partition (sql/queries/api.sql).
    assert counts(conn, gone) == (0, 0, 0, 3, 0)
    assert counts(conn, kept) == (1, 6, 3, 3, 1)


# --- a new target, a new secret ---------------------------------------------------------


async def test_subscription_and_rotation_target_are_the_callers_only(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    target = 'http://example.test/a?b="c"&d=\\e\u00e9'
    sid = sub(conn, tenant="acme", target=target)
    for read in (store.subscription_target, store.rotation_target):
        assert await read(id=sid, owner="alice", tenant="acme") == target
        assert await read(id=sid, owner="alice", tenant=None) == target
        for owner, tenant in (("mallory", None), ("mallory", "acme"), ("alice", "globex"),
                              *((odd, None) for odd in ODD)):
            assert await read(id=sid, owner=owner, tenant=tenant) is None
        assert await read(id=sid + 1, owner="alice", tenant=None) is None
    # The doc carries an odd target as the JSON string of it.
    assert json.loads(subscription(conn, sid)["doc"])["target"] == target


async def test_set_target_moves_only_from_the_target_verified_before(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    sid, old = subscribe(conn, "http://one.test/", owner="alice")
    before = subscription(conn, sid)
    # Its target changed during the handshake (another request): nothing moves.
    assert not await store.set_subscription_target(
        id=sid, owner="alice", tenant=None, target="http://two.test/",
        previous="http://other.test/", secret="whsec_new", overlap=60)
    assert not await store.set_subscription_target(
        id=sid + 1, owner="alice", tenant=None, target="http://two.test/",
        previous="http://one.test/", secret="whsec_new", overlap=60)
    # Another owner's or tenant's request, though it names the id and its target.
    for owner, tenant in (("mallory", None), ("alice", "acme")):
        assert not await store.set_subscription_target(
            id=sid, owner=owner, tenant=tenant, target="http://evil.test/",
            previous="http://one.test/", secret="whsec_evil", overlap=60)
    assert subscription(conn, sid) == before
    assert await store.set_subscription_target(
        id=sid, owner="alice", tenant=None, target="http://two.test/",
        previous="http://one.test/", secret="whsec_new", overlap=60)
    row = subscription(conn, sid)
    assert (row["target"], row["secret"], row["previous_secret"]) == (
        "http://two.test/", "whsec_new", old)
    ahead = conn.execute("SELECT %s - now()", (row["previous_secret_expires_at"],)).fetchone()
    assert ahead is not None and 59 <= ahead[0].total_seconds() <= 60
    assert json.loads(row["doc"])["target"] == "http://two.test/"
    # No overlap: the secret it replaces stops signing at once.
    assert await store.set_subscription_target(
        id=sid, owner="alice", tenant=None, target="http://three.test/",
        previous="http://two.test/", secret="whsec_third", overlap=0)
    row = subscription(conn, sid)
    assert (row["secret"], row["previous_secret"], row["previous_secret_expires_at"]) == (
        "whsec_third", None, None)


async def test_rotate_secret_keeps_the_old_one_for_the_overlap(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    sid, old = subscribe(conn, owner="alice", tenant="acme")
    doc = await store.rotate_secret(id=sid, owner="alice", tenant="acme", target=NOWHERE,
                                    secret="whsec_new", overlap=30)
    row = subscription(conn, sid)
    assert doc is not None and doc == row["doc"]
    assert "whsec_new" not in doc and old not in doc
    assert (row["secret"], row["previous_secret"]) == ("whsec_new", old)
    ahead = conn.execute("SELECT %s - now()", (row["previous_secret_expires_at"],)).fetchone()
    assert ahead is not None and 20 <= ahead[0].total_seconds() <= 30
    assert await store.rotate_secret(id=sid, owner="alice", tenant=None, target=NOWHERE,
                                     secret="whsec_third", overlap=0) is not None
    row = subscription(conn, sid)
    assert (row["secret"], row["previous_secret"], row["previous_secret_expires_at"]) == (
        "whsec_third", None, None)


async def test_rotate_secret_of_a_foreign_or_moved_subscription_changes_nothing(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    sid = sub(conn, tenant="acme")
    before = subscription(conn, sid)
    for owner, tenant, target in (("mallory", None, NOWHERE), ("mallory", "acme", NOWHERE),
                                  ("alice", "globex", NOWHERE),
                                  ("alice", "acme", "http://moved.test/"),
                                  ("alice", "acme", NOWHERE.upper()),
                                  *((odd, None, NOWHERE) for odd in ODD)):
        assert await store.rotate_secret(id=sid, owner=owner, tenant=tenant, target=target,
                                         secret="whsec_evil", overlap=60) is None
    assert await store.rotate_secret(id=sid + 1, owner="alice", tenant=None, target=NOWHERE,
                                     secret="whsec_evil", overlap=60) is None
    assert subscription(conn, sid) == before


# --- tokens -----------------------------------------------------------------------------


async def test_lookup_token_finds_the_unrevoked_token_only(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    digest = token(conn, "al'ice\u200b", "acme")
    other = token(conn, "alice")
    tid = token_id(conn, digest)
    assert await store.lookup_token(token_hash=digest) == (tid, "al'ice\u200b", "acme", digest)
    assert await store.lookup_token(token_hash=other) == (
        token_id(conn, other), "alice", None, other)
    assert tokens.revoke(conn, tid)
    assert await store.lookup_token(token_hash=digest) is None
    assert await store.lookup_token(token_hash=other) is not None
    for unknown in (b"", digest[:-1], digest + b"\x00", bytes(32)):
        assert await store.lookup_token(token_hash=unknown) is None


# --- the events registry ----------------------------------------------------------------


async def test_registry_leaves_private_events_out_of_what_may_be_subscribed_to(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    conn.execute("SELECT webhooks.attach('public.payments', resource => 'payments',"
                 " noun => 'payment', parent_resource => 'invoices',"
                 " parent_column => 'invoice_id', public => false)")
    invoice = [f"invoice.{v}" for v in ("create", "delete", "truncate", "update")]
    webhook = [f"webhook.{e}" for e in ("disabled", "failing", "recovered")]
    assert await store.hook_events() == (
        [{"resource": "invoices", "event": e} for e in invoice]
        + [{"resource": "webhooks", "event": e} for e in webhook])
    assert await store.public_resources() == [("invoices",), ("webhooks",)]
    # The registry the checks read holds the private events too, marked so.
    payment = [f"payment.{v}" for v in ("create", "delete", "truncate", "update")]
    assert await store.resource_events(resource="invoices") == sorted(
        [(e, True, "invoice") for e in invoice] + [(e, False, "invoice") for e in payment])
    assert await store.resource_events(resource="webhooks") == [
        (e, True, None) for e in webhook]
    for odd in ("payments", "INVOICES", "invoices ", "invoice%", "%", ""):
        assert await store.resource_events(resource=odd) == [], odd


async def test_a_wholly_private_resource_is_not_offered_and_own_noun_is_the_attached_ones(
        conn: psycopg.Connection[Any], pool: AsyncConnectionPool) -> None:
    store = Store(pool)
    conn.execute("CREATE TABLE public.secrets (id bigint PRIMARY KEY, note text)")
    conn.execute("SELECT webhooks.attach('public.secrets', resource => 'secrets',"
                 " noun => 'secret', public => false)")
    assert ("secrets",) not in await store.public_resources()
    assert all(e["resource"] != "secrets" for e in await store.hook_events())
    assert {r[1] for r in await store.resource_events(resource="secrets")} == {False}
    assert await store.own_noun(resource="invoices") == {"noun": "invoice"}
    assert await store.own_noun(resource="secrets") == {"noun": "secret"}
    for none in ("webhooks", "Invoices", "invoices ", "%", ""):
        assert await store.own_noun(resource=none) is None, none
