"""Filters: the compiled SQL/JSON path against a plain Python reference on
random rows and filters."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import filters
from tests.support.filters import evaluate

COLUMNS = ["a", "b", "c", "d"]


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5),
    st.sampled_from([Decimal("1.5"), Decimal("-0.25"), Decimal("2.0")]),
    st.sampled_from(["", "a", "b", "ab", "é", "Z", "10", "2"]))
values = st.one_of(scalars, st.lists(scalars, max_size=2),
                   st.dictionaries(st.sampled_from(["k"]), scalars, max_size=1))
rows = st.fixed_dictionaries({c: values for c in COLUMNS})
comparable = st.one_of(st.integers(-5, 5), st.sampled_from(["", "a", "b", "é", "10"]),
                       st.sampled_from([Decimal("1.5"), Decimal("-0.25")]))
conditions = st.one_of(
    scalars,
    st.builds(lambda op, v: {op: v}, st.sampled_from(["eq", "ne"]), scalars),
    st.builds(lambda op, v: {op: v}, st.sampled_from(["gt", "gte", "lt", "lte"]), comparable),
    st.builds(lambda op, v: {op: v}, st.sampled_from(["in", "nin"]),
              st.lists(scalars, min_size=1, max_size=3)),
    st.builds(lambda v: {"exists": v}, st.booleans()))
filter_sets = st.dictionaries(st.sampled_from(COLUMNS), conditions, min_size=1, max_size=3)
changes = st.one_of(st.none(), st.lists(st.sampled_from(COLUMNS), max_size=3, unique=True))


def to_json(value: Any) -> str:
    return json.dumps(value, default=lambda d: float(d) if d % 1 else int(d))


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(filter_=filter_sets, row=rows, changed=changes,
       watch=st.one_of(st.none(), st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=2)))
def test_postgres_agrees_with_the_reference(conn: psycopg.Connection, filter_: dict[str, Any],
                                            row: dict[str, Any], changed: list[str] | None,
                                            watch: list[str] | None) -> None:
    if watch is not None:
        filter_ = {**filter_, "$changed": watch}
    filter_ = filters.check(json.loads(to_json(filter_)), COLUMNS, COLUMNS)
    path = filters.compile_path(filter_)
    assert path is not None
    got = conn.execute("SELECT webhooks.filter_passes(%s::jsonpath, %s::jsonb, %s::text[])",
                       (path, to_json(row), changed)).fetchone()
    # The reference reads the row as Postgres sends it: numbers exactly.
    expected = evaluate(filter_, json.loads(to_json(row), parse_float=Decimal), changed)
    assert got == (expected,), (path, row, changed)
