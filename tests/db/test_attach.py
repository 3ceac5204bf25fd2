"""webhooks.attach / webhooks.detach: the DBA's interface, including every bad input, and
what its settings do: no row means no old row either, a column sent again is announced, a
dropped table stops its subscriptions, saying why (the API's side of these:
tests/e2e/test_guest_dba.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from service.store import Store
from tests.support.fanout import drain_outbox
from tests.support.notes import attach, bodies, make_notes
from tests.support.subscriptions import subscribe, subscribe_to, subscription
from tests.support.worker import open_pool


def registry(conn: psycopg.Connection, resource: str) -> list[tuple[str, bool]]:
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT event, public FROM webhooks.hook_events WHERE resource = %s ORDER BY event",
        (resource,)).fetchall()]


def triggers(conn: psycopg.Connection, table: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal "
        "ORDER BY tgname", (table,)).fetchall()]


@pytest.fixture
def shipments(conn: psycopg.Connection) -> psycopg.Connection:
    conn.execute("""
        CREATE TABLE shipments (
            shipment_no bigint PRIMARY KEY, invoice_id bigint, carrier text,
            secret_note text, tenant text, edited_by text)""")
    return conn


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with open_pool(db_url, max_size=4) as p:
        yield p


def test_nested_events_are_registered_under_the_parent(conn: psycopg.Connection) -> None:
    assert registry(conn, "invoices") == [
        ("invoice.create", True), ("invoice.delete", True), ("invoice.truncate", True),
        ("invoice.update", True), ("payment.create", True), ("payment.delete", True),
        ("payment.truncate", True), ("payment.update", True)]
    assert registry(conn, "payments") == []


def test_attach_is_idempotent_and_replaces_settings(shipments: psycopg.Connection) -> None:
    conn = shipments
    for _ in range(2):
        conn.execute("SELECT webhooks.attach('shipments', resource => 'shipments', "
                     "noun => 'shipment', id_column => 'shipment_no')")
    assert registry(conn, "shipments") == [
        ("shipment.create", True), ("shipment.delete", True), ("shipment.truncate", True),
        ("shipment.update", True)]
    assert triggers(conn, "shipments") == ["webhooks_1_insert", "webhooks_2_update",
                                           "webhooks_3_delete", "webhooks_4_truncate"]
    conn.execute("SELECT webhooks.attach('shipments', resource => 'shipments', "
                 "noun => 'shipment', id_column => 'shipment_no', public => false)")
    assert {p for _, p in registry(conn, "shipments")} == {False}
    count = conn.execute("SELECT count(*) FROM webhooks.attachments "
                         "WHERE resource = 'shipments'").fetchone()
    assert count == (1,)


def test_moving_a_table_under_a_parent_moves_its_events(shipments: psycopg.Connection) -> None:
    conn = shipments
    conn.execute("SELECT webhooks.attach('shipments', resource => 'shipments', "
                 "noun => 'shipment', id_column => 'shipment_no')")
    conn.execute("SELECT webhooks.attach('shipments', resource => 'shipments', "
                 "noun => 'shipment', id_column => 'shipment_no', "
                 "parent_resource => 'invoices', parent_column => 'invoice_id')")
    assert registry(conn, "shipments") == []
    assert ("shipment.create", True) in registry(conn, "invoices")


def test_detach_stops_capture_and_unregisters(conn: psycopg.Connection) -> None:
    subscribe_to(conn, "invoices", ["payment.create"])
    conn.execute("SELECT webhooks.detach('public.payments')")
    conn.execute("SELECT webhooks.detach('public.payments')")  # idempotent
    assert triggers(conn, "payments") == []
    assert [e for e, _ in registry(conn, "invoices")] == [
        "invoice.create", "invoice.delete", "invoice.truncate", "invoice.update"]
    conn.execute("INSERT INTO invoices (id, number, customer, amount) VALUES (1, 'a', 'b', 1)")
    conn.execute("INSERT INTO payments (invoice_id, amount) VALUES (1, 1)")
    assert conn.execute("SELECT count(*) FROM webhooks.outbox").fetchone() == (0,)


BAD_CALLS = [
    ("webhooks.attach('no_such_table', resource => 'x', noun => 'x')",
     'relation "no_such_table" does not exist'),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'shipment')",
     "has no column id"),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'shipment', "
     "id_column => 'shipment_no', parent_resource => 'invoices', parent_column => 'nope')",
     "has no column nope"),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'shipment', "
     "id_column => 'shipment_no', user_column => 'nope')", "has no column nope"),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'shipment', "
     "id_column => 'shipment_no', tenant_column => 'nope')", "has no column nope"),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'shipment', "
     "id_column => 'shipment_no', exclude_columns => ARRAY['carrier', 'nope'])",
     "has no column nope"),
    ("webhooks.attach('shipments', resource => 'Shipments', noun => 'shipment', "
     "id_column => 'shipment_no')", "resource 'Shipments' must be lowercase"),
    ("webhooks.attach('shipments', resource => 'ship-ments', noun => 'shipment', "
     "id_column => 'shipment_no')", "must be lowercase letters"),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'ship ment', "
     "id_column => 'shipment_no')", "noun 'ship ment' must be lowercase"),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'shipment.x', "
     "id_column => 'shipment_no')", "must be lowercase letters"),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'shipment', "
     "id_column => 'shipment_no', parent_resource => 'Invoices', "
     "parent_column => 'invoice_id')", "parent_resource 'Invoices' must be lowercase"),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'shipment', "
     "id_column => 'shipment_no', parent_column => 'invoice_id')",
     "parent_resource and parent_column go together"),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'shipment', "
     "id_column => 'shipment_no', parent_resource => 'invoices')",
     "parent_resource and parent_column go together"),
    ("webhooks.attach('shipments', resource => 'invoices', noun => 'shipment', "
     "id_column => 'shipment_no')",
     "resource 'invoices' is already attached to table public.invoices"),
    ("webhooks.attach('shipments', resource => 'shipments', noun => 'payment', "
     "id_column => 'shipment_no', parent_resource => 'invoices', "
     "parent_column => 'invoice_id')", "already belong to table public.payments"),
    ("webhooks.attach('webhooks.attempts_delivery_idx', resource => 'x', noun => 'x')",
     "is not a table"),
]


@pytest.mark.parametrize(("call", "message"), BAD_CALLS)
def test_bad_input_is_a_clear_error_and_changes_nothing(
        shipments: psycopg.Connection, call: str, message: str) -> None:
    conn = shipments

    def snapshot() -> tuple[object, ...]:
        return (
            conn.execute("SELECT array_agg(resource ORDER BY resource) "
                         "FROM webhooks.attachments").fetchone(),
            conn.execute("SELECT array_agg(resource || event ORDER BY resource, event) "
                         "FROM webhooks.hook_events").fetchone(),
            tuple(triggers(conn, "shipments")),
        )

    before = snapshot()
    with pytest.raises(psycopg.Error) as error:
        conn.execute(f"SELECT {call}")
    assert message in str(error.value)
    assert snapshot() == before


# --- what the DBA's settings do (tests/e2e/test_guest_dba.py: through the API) -------

# include_row => false sends no row, old or new.

def test_attach_refuses_previous_without_row(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE notes (id bigint PRIMARY KEY, body text)")
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match="include_previous => true needs include_row => true"):
        attach(conn, include_row=False, include_previous=True)
    assert conn.execute("SELECT count(*) FROM webhooks.attachments "
                        "WHERE resource = 'notes'").fetchone() == (0,)


async def test_an_earlier_attachment_with_previous_and_no_row_sends_neither(
        conn: psycopg.Connection, pool: AsyncConnectionPool) -> None:
    make_notes(conn, include_row=False)
    # As an earlier version let it be, and as its capture function queued it.
    conn.execute("UPDATE webhooks.attachments SET include_previous = true "
                 "WHERE resource = 'notes'")
    conn.execute("SELECT webhooks.install_capture('notes')")
    subscribe(conn, resource="notes", events=["note.update"])
    conn.execute("INSERT INTO notes VALUES (1, 'old', 's')")
    conn.execute("UPDATE notes SET body = 'new' WHERE id = 1")
    conn.execute("UPDATE notes SET body = 'newer' WHERE id = 1")
    conn.execute("UPDATE webhooks.outbox SET include_previous = true "
                 "WHERE id = (SELECT max(id) FROM webhooks.outbox)")
    await drain_outbox(Store(pool), 100)
    sent = bodies(conn, "note.update")
    assert len(sent) == 2
    for body in sent:
        assert set(body) == {"event"}, body
        assert body["event"]["changed"] == ["body"]


# A column sent again is announced.

def test_reattaching_without_an_excluded_column_names_it_in_a_notice(
        conn: psycopg.Connection) -> None:
    # A Diagnostic is readable only inside the handler.
    notices: list[tuple[str | None, str | None]] = []
    conn.add_notice_handler(lambda d: notices.append((d.severity_nonlocalized,
                                                      d.message_primary)))
    make_notes(conn, exclude_columns=["secret"])
    attach(conn, exclude_columns=["secret"])
    assert [n for n in notices if "now sends" in (n[1] or "")] == []
    attach(conn)
    [(severity, message)] = [n for n in notices if "now sends" in (n[1] or "")]
    assert severity == "NOTICE"
    assert "column(s) secret," in (message or "")

    notices.clear()
    attach(conn, columns=["id"])
    attach(conn)
    [(_, again)] = [n for n in notices if "now sends" in (n[1] or "")]
    assert "column(s) body, secret," in (again or "")


# A dropped table leaves its subscriptions inactive, saying why.

def test_dropping_an_attached_table_stops_its_subscriptions(conn: psycopg.Connection) -> None:
    make_notes(conn)
    sid, _ = subscribe(conn, resource="notes", events=["note.create"])
    conn.execute("DROP TABLE notes")
    row = subscription(conn, sid)
    assert row["active"] is False
    assert "public.notes was dropped" in row["inactive_reason"]
