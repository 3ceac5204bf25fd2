"""Subscription filters: checked once at create, compiled to one SQL/JSON
path predicate that fan-out evaluates in Postgres for each change
(webhooks.filter_passes in sql/fanout.sql). The tests compare it against the same
semantics in plain Python (tests/support/filters.py) on random rows and filters.

A filter is a JSON object; every condition must hold. A key is a column of the row as
sent; its value is a scalar (equality) or an object with one operator:

    eq, ne          equal / not equal: same JSON type and value (numbers by value)
    gt, gte, lt, lte
                    a number or a string (strings by code point); a value of another
                    type, or a column holding one, never compares
    in, nin         an array of 1 to 100 scalars: equal to one of them / to none
    exists          true: the column is not null; false: it is null

The key "$changed" takes an array of column names: an update passes when one of them
changed; other events pass. Arrays and objects in a column are never equal to a scalar.

Besides the limits of each part, a filter has a total budget: MAX_LITERALS values in all
(every scalar it compares with, and every $changed name), MAX_FILTER_BYTES as compact
JSON, MAX_PATH_BYTES compiled. Fan-out evaluates a filter for every change its events
match, under the one fan-out lock, so what one filter may cost is bounded here, and what
an owner's filters may cost together by WEBHOOKS_MAX_FILTER_BYTES_PER_OWNER (the API).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "exists")
CHANGED = "$changed"
MAX_CONDITIONS = 50
MAX_VALUES = 100
MAX_STRING = 1024
MAX_LITERALS = 200
MAX_FILTER_BYTES = 8192
MAX_PATH_BYTES = 16384


class FilterError(ValueError):
    """A filter that cannot be used; the message says which part and why."""


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool, int, float))


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_value(column: str, op: str, value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise FilterError(f"filter: {column!r} {op}: numbers must be finite")
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise FilterError(f"filter: {column!r} {op}: strings are at most {MAX_STRING} "
                              "characters")
        if "\x00" in value:
            raise FilterError(f"filter: {column!r} {op}: strings cannot contain NUL")


def check(filter_: Any, sent: Sequence[str] | None, named: Sequence[str]) -> dict[str, Any]:
    """The filter, checked: `sent` are the columns every event of the subscription sends
    (None when some event sends no row), `named` those it may name in $changed. Raises
    FilterError naming what is wrong."""
    if not isinstance(filter_, dict):
        raise FilterError("field 'filter' must be an object of conditions, e.g. "
                          '{"status": "paid", "amount": {"gte": 100}}')
    if len(filter_) > MAX_CONDITIONS:
        raise FilterError(f"filter: at most {MAX_CONDITIONS} conditions")
    for column, condition in filter_.items():
        if "\x00" in column:
            raise FilterError("filter: column names cannot contain NUL")
        if column == CHANGED:
            if (not isinstance(condition, list) or not condition
                    or not all(isinstance(c, str) for c in condition)):
                raise FilterError('filter: "$changed" takes a non-empty array of column names')
            for name in condition:
                if name not in named:
                    raise FilterError(f'filter: "$changed" names {_shown(name)}, which is not a '
                                      "column these events send (excluded or unknown)")
            continue
        if sent is None or column not in sent:
            why = ("these events send no row (attached with include_row => false)"
                   if sent is None else "it is excluded, unknown or not sent by every "
                                        "event of the subscription")
            raise FilterError(f"filter: no column {_shown(column)} to filter on: {why}")
        if _scalar(condition):
            _check_value(column, "eq", condition)
            continue
        if not isinstance(condition, dict) or len(condition) != 1:
            raise FilterError(f"filter: {column!r} takes a scalar or an object with one "
                              f"operator ({', '.join(OPERATORS)})")
        ((op, value),) = condition.items()
        if op not in OPERATORS:
            raise FilterError(f"filter: unknown operator {_shown(op)} on {column!r}; "
                              f"operators: {', '.join(OPERATORS)}")
        if op in ("in", "nin"):
            if (not isinstance(value, list) or not 1 <= len(value) <= MAX_VALUES
                    or not all(_scalar(v) for v in value)):
                raise FilterError(f"filter: {column!r} {op} takes an array of 1 to "
                                  f"{MAX_VALUES} scalars")
            for v in value:
                _check_value(column, op, v)
        elif op == "exists":
            if not isinstance(value, bool):
                raise FilterError(f"filter: {column!r} exists takes true or false")
        elif op in ("eq", "ne"):
            if not _scalar(value):
                raise FilterError(f"filter: {column!r} {op} takes a scalar, not "
                                  f"{_shown(value)}")
            _check_value(column, op, value)
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise FilterError(f"filter: {column!r} {op} takes a number or a string")
            _check_value(column, op, value)
    _check_budget(filter_)
    return filter_


def literals(filter_: Mapping[str, Any]) -> int:
    """How many values a (checked) filter compares with, $changed names included."""
    count = 0
    for condition in filter_.values():
        if isinstance(condition, list):
            count += len(condition)
        elif isinstance(condition, dict):
            ((_, value),) = condition.items()
            count += len(value) if isinstance(value, list) else 1
        else:
            count += 1
    return count


def size(filter_: Mapping[str, Any]) -> int:
    """The filter's bytes as compact UTF-8 JSON (as stored and returned)."""
    return len(json.dumps(filter_, ensure_ascii=False, separators=(",", ":")).encode())


def _check_budget(filter_: Mapping[str, Any]) -> None:
    count = literals(filter_)
    if count > MAX_LITERALS:
        raise FilterError(f"filter: {count} values in all, over the limit of {MAX_LITERALS} "
                          "values per filter (every compared value and $changed name counts)")
    length = size(filter_)
    if length > MAX_FILTER_BYTES:
        raise FilterError(f"filter: {length} bytes as JSON, over the limit of "
                          f"{MAX_FILTER_BYTES} bytes per filter")
    compiled = compile_path(filter_)
    if compiled is not None and len(compiled.encode()) > MAX_PATH_BYTES:
        raise FilterError(f"filter: compiles to {len(compiled.encode())} bytes, over the limit "
                          f"of {MAX_PATH_BYTES} compiled bytes per filter (non-ASCII text "
                          "compiles to \\u escapes, 6 bytes a character)")


# --- compiling to SQL/JSON path --------------------------------------------------------

def _literal(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(value, ensure_ascii=True)


_COMPARE = {"eq": "==", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def _condition(column: str, condition: Any) -> str:
    at = f"$.{json.dumps(column, ensure_ascii=True)}"
    if column == CHANGED:
        names = " || ".join(f"@ == {_literal(n)}" for n in condition)
        return f"($update == false || exists($changed[*] ? ({names})))"
    if _scalar(condition):
        condition = {"eq": condition}
    ((op, value),) = condition.items()
    if op == "exists":
        null = f"exists({at} ? (@ == null))"
        return f"!({null})" if value else null
    if op in ("in", "nin"):
        alternatives = " || ".join(f"@ == {_literal(v)}" for v in value)
        found = f"exists({at} ? ({alternatives}))"
        return f"!({found})" if op == "nin" else found
    if op == "ne":
        return f"!(exists({at} ? (@ == {_literal(value)})))"
    return f"exists({at} ? (@ {_COMPARE[op]} {_literal(value)}))"


def compile_path(filter_: Mapping[str, Any]) -> str | None:
    """The filter as a strict SQL/JSON path that selects the row when every condition
    holds, or None when there is none (an empty filter passes everything)."""
    if not filter_:
        return None
    return "strict $ ? (" + " && ".join(_condition(c, v) for c, v in filter_.items()) + ")"

