"""The type mapping of service.api.schemas: each PostgreSQL type as the capture functions
write it, and the cache that follows the catalog."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from service.api import schemas


def column(name: str, base: str, *, not_null: bool = False, typmod: int = -1,
           array: bool = False, builtin: bool = True, kind: str = "b",
           labels: list[str] | None = None) -> list[Any]:
    return [name, not_null, base, base, kind, typmod, array, builtin, labels]


def table(*columns: list[Any], **attachment: Any) -> dict[str, Any]:
    row = {"hook_resource": "things", "events": ["thing.create", "thing.update"],
           "resource": "things", "parent_resource": None, "parent_column": None,
           "id_column": "id", "exclude_columns": [], "allowed": None, "include_row": True,
           "include_previous": False, "columns": json.dumps(list(columns))}
    return {**row, **attachment}


def valid(schema: dict[str, Any], value: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def resource(row: dict[str, Any], event: str = "thing.create") -> dict[str, Any]:
    schema: dict[str, Any] = schemas.table_schemas(row)[event]["properties"]["resource"]
    return schema


def test_values_are_typed_as_they_are_written() -> None:
    row = resource(table(
        column("id", "int8", not_null=True), column("n", "numeric", typmod=655366),
        column("v", "varchar", typmod=9), column("c", "bpchar", typmod=7),
        column("m", "mood", builtin=False, kind="e", labels=["sad", "ok"]),
        column("ms", "mood", builtin=False, kind="e", labels=["sad"], array=True),
        column("ia", "int4", array=True), column("r", "int4range"),
        column("ts", "timestamp"), column("tz", "timestamptz", not_null=True),
        column("j", "jsonb"), column("by", "bytea")))
    checks = {
        "id": ([1, -2**63], [None, 1.5, "1", 2**63]),
        "n": ([1.25, 0, "NaN", None], ["Infinity", "1.25"]),
        "v": (["abcde", None], ["abcdef", 5]),
        "c": (["abc", None], ["ab", "abcd"]),
        "m": (["sad", None], ["happy", ""]),
        "ms": (["{sad,ok}", None], [["sad"]]),
        "ia": ([[1, None], [[1, 2], [3, None]], [], None], [["1"], [1.5], "{1}"]),
        "r": (["[1,5)", "empty"], [[1, 5]]),
        "ts": (["2026-01-02T03:04:05", "2026-01-02T03:04:05.5", "-infinity",
                "0044-03-15T00:00:00 BC", None], ["2026-01-02T03:04:05+00:00"]),
        "tz": (["2026-01-02T03:04:05.123456+00:00", "infinity", "12000-01-01T00:00:00+00:00"],
               [None, "2026-01-02T03:04:05Z", "2026-01-02T03:04:05+02:00"]),
        "j": ([None, 1, "x", [1], {"a": {"b": None}}], []),
        "by": (["\\x", "\\x01ff", None], ["0x01", "\\x1"]),
    }
    for name, (good, bad) in checks.items():
        for value in good:
            assert valid(row["properties"][name], value), (name, value)
        for value in bad:
            assert not valid(row["properties"][name], value), (name, value)
    assert row["required"] == list(checks)
    assert row["additionalProperties"] is False


def test_exclusions_the_allow_list_and_include_row() -> None:
    columns = [column("id", "int4", not_null=True), column("a", "text"), column("b", "text")]
    assert resource(table(*columns, exclude_columns=["b"]))["required"] == ["id", "a"]
    assert resource(table(*columns, allowed=["id", "b"]))["required"] == ["id", "b"]
    quiet = schemas.table_schemas(table(*columns, include_row=False))
    assert set(quiet["thing.update"]["properties"]) == {"event"}
    changed = quiet["thing.update"]["properties"]["event"]["properties"]["changed"]
    assert changed["items"]["enum"] == ["id", "a", "b"]
    previous = schemas.table_schemas(table(*columns, include_previous=True))
    assert set(previous["thing.update"]["properties"]) == {
        "event", "resource", "resource_omitted", "previous", "previous_omitted"}
    assert "previous" not in previous["thing.create"]["properties"]
    snapshot = previous["thing.snapshot"]["properties"]["event"]["properties"]
    assert valid(snapshot["user_id"], None) and "changed" not in snapshot


def test_the_cache_follows_the_catalog() -> None:
    row = table(column("id", "int4", not_null=True))
    first = schemas.encoded(row)
    assert schemas.encoded(dict(row)) is first
    schemas.event_schemas([])  # detached: dropped from the cache
    assert schemas.encoded(dict(row)) is not first
    wider = table(column("id", "int4", not_null=True), column("x", "text"))
    assert b'"x"' in bytes(schemas.encoded(wider)["thing.create"])
    assert b'"x"' not in bytes(first["thing.create"])
    listed = json.loads(schemas.hook_events_json([row]))
    assert [(e["resource"], e["event"]) for e in listed] == [
        ("things", "thing.create"), ("things", "thing.update")]
    assert listed[0]["schema"]["$schema"] == schemas.DIALECT
