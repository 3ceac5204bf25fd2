"""The named queries as the async store sends them: PostgreSQL's own placeholders, so that
psycopg parses nothing at each execution (service.db.raw_query)."""

from __future__ import annotations

import re

from service.db import queries, raw_query


def test_every_named_placeholder_becomes_a_numbered_one() -> None:
    for name, text in queries().items():
        raw, names = raw_query(name)
        sent = raw.decode()
        assert "%(" not in sent, name
        used = set(re.findall(r"%\((\w+)\)s", text))
        assert set(names) == used and len(names) == len(used), name
        numbers = {int(n) for n in re.findall(r"\$(\d+)", sent)}
        assert numbers == set(range(1, len(names) + 1)), name


def test_a_placeholder_used_twice_is_one_parameter() -> None:
    raw, names = raw_query("fanout")
    assert names.count("take") == 1
    take = f"${names.index('take') + 1}"
    assert raw.decode().count(take + "::int") >= 1
    assert raw.decode().count(take) >= 2  # the gate and the batch bound


def test_a_literal_percent_is_sent_once() -> None:
    (name,) = [n for n, q in queries().items() if "%%" in q]  # a LIKE pattern's
    sent = raw_query(name)[0].decode()
    assert "%%" not in sent and "LIKE '%." in sent


def test_a_query_without_placeholders_is_sent_as_it_is() -> None:
    for name, text in queries().items():
        if "%(" not in text:
            assert raw_query(name) == (text.encode(), ())
