"""The semantics of subscription filters (service/filters.py) in plain Python: the
reference tests/db/test_filter_sql.py compares the compiled SQL/JSON path against, on
random rows and filters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from service.filters import CHANGED


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool, int, float))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def _equal(a: Any, b: Any) -> bool:
    if _number(a) and _number(b):
        return Decimal(str(a)) == Decimal(str(b))
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return False


def _order(a: Any, b: Any) -> int | None:
    if _number(a) and _number(b):
        x, y = Decimal(str(a)), Decimal(str(b))
    elif isinstance(a, str) and isinstance(b, str):
        x, y = a, b  # type: ignore[assignment]
    else:
        return None
    return (x > y) - (x < y)


def evaluate(filter_: Mapping[str, Any], row: Mapping[str, Any],
             changed: Sequence[str] | None) -> bool:
    """Whether a change passes: `row` as sent, `changed` None unless an update."""
    for column, condition in filter_.items():
        if column == CHANGED:
            if changed is not None and not set(condition) & set(changed):
                return False
            continue
        if column not in row:
            return False
        value = row[column]
        if _scalar(condition):
            condition = {"eq": condition}
        ((op, wanted),) = condition.items()
        if op == "exists":
            ok = (value is not None) == wanted
        elif op in ("in", "nin"):
            found = any(_equal(value, w) for w in wanted)
            ok = found if op == "in" else not found
        elif op == "eq":
            ok = _equal(value, wanted)
        elif op == "ne":
            ok = not _equal(value, wanted)
        else:
            order = _order(value, wanted)
            ok = order is not None and {"gt": order > 0, "gte": order >= 0,
                                        "lt": order < 0, "lte": order <= 0}[op]
        if not ok:
            return False
    return True
