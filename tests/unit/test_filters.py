"""Filters: the checks at create. The compiled SQL/JSON path against the
Python reference: tests/db/test_filter_sql.py; over the API: tests/e2e/test_filters_api.py."""

from __future__ import annotations

from typing import Any

import pytest

from service import filters

COLUMNS = ["a", "b", "c", "d"]


# --- checks -------------------------------------------------------------------------

@pytest.mark.parametrize(("given", "fragment"), [
    ([], "must be an object"),
    ({"nope": 1}, 'no column "nope"'),
    ({"a": {"gt": 1, "lt": 3}}, "one operator"),
    ({"a": {"like": "x"}}, 'unknown operator "like"'),
    ({"a": {"in": []}}, "array of 1 to 100"),
    ({"a": {"in": [[1]]}}, "array of 1 to 100"),
    ({"a": {"gt": True}}, "number or a string"),
    ({"a": {"gt": None}}, "number or a string"),
    ({"a": {"eq": {"x": 1}}}, "takes a scalar"),
    ({"a": {"exists": 1}}, "true or false"),
    ({"a": "x\x00y"}, "NUL"),
    ({"$changed": []}, "non-empty array"),
    ({"$changed": ["secret"]}, "not a column these events send"),
    ({"a": float("inf")}, "finite"),
])
def test_bad_filters_say_what_is_wrong(given: Any, fragment: str) -> None:
    with pytest.raises(filters.FilterError) as info:
        filters.check(given, COLUMNS, COLUMNS)
    assert fragment in str(info.value)


def test_no_column_condition_without_a_row() -> None:
    with pytest.raises(filters.FilterError, match="include_row"):
        filters.check({"a": 1}, None, COLUMNS)
    assert filters.check({"$changed": ["a"]}, None, COLUMNS) == {"$changed": ["a"]}
