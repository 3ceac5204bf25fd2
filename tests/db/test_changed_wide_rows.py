"""`event.changed` of wide rows: every changed column named, in table order, and nothing
else (fan-out matches the two rows' columns by name in one pass, whatever their number)."""

from __future__ import annotations

import psycopg

from tests.support.subscriptions import subscribe_to


def test_a_300_column_update_names_exactly_its_changed_columns(conn: psycopg.Connection
                                                                ) -> None:
    columns = ", ".join(f"c{i} text" for i in range(1, 301))
    conn.execute(f"CREATE TABLE public.wide (id int PRIMARY KEY, {columns}, j json)")
    conn.execute("SELECT webhooks.attach('public.wide', 'wides', 'wide',"
                 " include_previous => true)")
    subscribe_to(conn, "wides", ["wide.update"])
    values = ", ".join(f"repeat('{chr(97 + i % 26)}', 300)" for i in range(1, 301))
    conn.execute(f"INSERT INTO public.wide VALUES (1, {values}, 'null')")
    changes = ", ".join(f"c{i} = c{i} || 'x'" for i in range(1, 301, 3))
    # A json null becoming JSON's null text and back is no change; a json value that is
    # the same number written otherwise is one (values compare as captured).
    conn.execute(f"UPDATE public.wide SET {changes}, j = '1.0'")
    [(changed,)] = conn.execute(
        "SELECT c.changed FROM webhooks.outbox o CROSS JOIN LATERAL webhooks.changes(o) c"
        " WHERE o.name = 'wide.update'").fetchall()
    assert changed == [f"c{i}" for i in range(1, 301, 3)] + ["j"]
    conn.execute("DELETE FROM webhooks.outbox")
    conn.execute("UPDATE public.wide SET j = '1.00', c2 = c2")
    [(changed,)] = conn.execute(
        "SELECT c.changed FROM webhooks.outbox o CROSS JOIN LATERAL webhooks.changes(o) c"
        ).fetchall()
    assert changed == ["j"]
