"""The JSON Schema (draft 2020-12) of every public event's delivery body, derived from the
catalog at each request (sql/queries/api.sql, api_event_catalog), so a column added to
an attached table a moment ago is in it.

A value is typed as the capture functions write it (webhooks.column_sql): a built-in type
(through domains and into arrays) through json_build_object, with the format settings the
capture function pins (TimeZone UTC, DateStyle ISO, IntervalStyle postgres, bytea hex),
then written as jsonb writes it; any other type (an enum, a composite, a range or an
extension type, and arrays of them) as its text form, a string. docs/deliveries.md
("Schemas of the bodies") lists the mapping.
"""

from __future__ import annotations

from typing import Any

import msgspec

from service.api.models import Subscription

Schema = dict[str, Any]

DIALECT = "https://json-schema.org/draft/2020-12/schema"
# What float and numeric values json_build_object writes as strings, not numbers.
NOT_FINITE = ["NaN", "Infinity", "-Infinity"]
# json_build_object writes dates and timestamps as ISO 8601 (XSD) whatever DateStyle says:
# years past 9999 with more digits, years before 1 with " BC", and infinity as words.
_DAY = r"\d{4,}-\d{2}-\d{2}"
_CLOCK = r"\d{2}:\d{2}:\d{2}(\.\d{1,6})?"
DATE = {"anyOf": [{"type": "string", "format": "date", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
                  {"type": "string", "pattern": rf"^(-?infinity|{_DAY}( BC)?)$"}]}
TIMESTAMPTZ = {"anyOf": [
    {"type": "string", "format": "date-time",
     "pattern": rf"^\d{{4}}-\d{{2}}-\d{{2}}T{_CLOCK}\+00:00$"},
    {"type": "string", "pattern": rf"^(-?infinity|{_DAY}T{_CLOCK}\+00:00( BC)?)$"}]}
OCCURRED_AT = {"type": "string", "format": "date-time",
               "pattern": r"^\d{4,}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$"}
INTEGERS = {"int2": 2**15, "int4": 2**31, "int8": 2**63}
# Built-in types other than these are written as their text form: a string.
BUILT_IN: dict[str, Schema] = {
    "bool": {"type": "boolean"},
    "numeric": {"anyOf": [{"type": "number"}, {"type": "string", "enum": NOT_FINITE}]},
    "float4": {"anyOf": [{"type": "number"}, {"type": "string", "enum": NOT_FINITE}]},
    "float8": {"anyOf": [{"type": "number"}, {"type": "string", "enum": NOT_FINITE}]},
    "json": {}, "jsonb": {},
    "date": DATE,
    "timestamptz": TIMESTAMPTZ,
    "timestamp": {"type": "string", "pattern": rf"^(-?infinity|{_DAY}T{_CLOCK}( BC)?)$"},
    "time": {"type": "string", "pattern": rf"^{_CLOCK}$"},
    "timetz": {"type": "string", "pattern": rf"^{_CLOCK}[+-]\d{{2}}(:\d{{2}}){{0,2}}$"},
    "uuid": {"type": "string", "format": "uuid",
             "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
    "bytea": {"type": "string", "pattern": r"^\\x([0-9a-f]{2})*$"},
}
# PostgreSQL's arrays have at most 6 dimensions (MAXDIM).
MAX_DIMENSIONS = 6
SIGNATURE_HEADERS = {
    "webhook-id": "msg_<delivery id>: the same on every retry; de-duplicate on it",
    "webhook-timestamp": "Unix seconds of this attempt",
    "webhook-signature": "v1,<base64 HMAC-SHA256 of \"{webhook-id}.{webhook-timestamp}.{body}\">"
                         " (Standard Webhooks; during a secret's rotation two, space-separated)",
    "X-Hook-Signature": "hex HMAC-SHA256 of the body, keyed with the whole secret string",
}


def nullable(schema: Schema) -> Schema:
    """`schema` or null."""
    if "anyOf" in schema:
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    if "enum" in schema:
        return {**schema, "type": [schema["type"], "null"], "enum": [*schema["enum"], None]}
    if "type" in schema:
        return {**schema, "type": [schema["type"], "null"]}
    return schema  # any value (json, jsonb), null included


def scalar_schema(column: dict[str, Any]) -> Schema:
    """The schema of one value (or array element) of a built-in type, not null."""
    base, typmod = column["base"], column["typmod"]
    if base in INTEGERS:
        return {"type": "integer", "minimum": -INTEGERS[base], "maximum": INTEGERS[base] - 1}
    if base == "numeric" and typmod >= 0:  # numeric(p, s) holds NaN but no infinity
        return {"anyOf": [{"type": "number"}, {"type": "string", "enum": ["NaN"]}]}
    if base in BUILT_IN:
        return dict(BUILT_IN[base])
    if column["kind"] == "c":  # a built-in composite (a catalog's row type)
        return {"type": "object"}
    if base == "varchar" and typmod >= 4:
        return {"type": "string", "maxLength": typmod - 4}
    if base == "bpchar" and typmod >= 4:  # blank-padded to its length
        return {"type": "string", "minLength": typmod - 4, "maxLength": typmod - 4}
    return {"type": "string"}  # its output function's text: interval, inet, ranges, ...


def column_schema(column: dict[str, Any]) -> Schema:
    """The schema of a column's value as it is sent, null unless the column is NOT NULL."""
    if not column["builtin"]:
        # Written through its output function: an enum's label, or the text form of a
        # composite, a range, an extension type, or an array of any of them.
        if column["labels"] is not None and not column["array"]:
            schema: Schema = {"type": "string", "enum": column["labels"]}
        else:
            schema = {"type": "string"}
    elif column["array"]:
        # A JSON array (nested for more dimensions); any element may be NULL.
        element = nullable(scalar_schema(column))
        items = element
        for _ in range(MAX_DIMENSIONS - 1):
            items = {"anyOf": [element, {"type": "array", "items": items}]}
        schema = {"type": "array", "items": items}
    else:
        schema = scalar_schema(column)
    schema = {**schema, "description": column["type"]}
    return schema if column["not_null"] else nullable(schema)


def row_schema(entry: dict[str, Any]) -> Schema:
    """The row as sent: the columns left after exclude_columns and the allow-list, in
    table order, each of them always present."""
    columns = sent_columns(entry)
    return {"type": "object", "additionalProperties": False,
            "required": [c["name"] for c in columns],
            "properties": {c["name"]: column_schema(c) for c in columns}}


def sent_columns(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's columns that may leave the database (webhooks.row_columns)."""
    allowed = entry["allowed"]
    return [c for c in entry["columns"] or []
            if c["name"] not in entry["exclude_columns"]
            and (allowed is None or c["name"] in allowed)]


def _column(entry: dict[str, Any], name: str | None) -> Schema:
    for column in entry["columns"] or []:
        if column["name"] == name:
            return column_schema(column)
    return {}


def event_member(entry: dict[str, Any], verb: str) -> Schema:
    """The `event` member of a table's event, its members in the order sent."""
    truncate = verb == "truncate"
    properties: Schema = {
        "id": {"type": "integer", "minimum": 1},
        "name": {"const": entry["event"]},
        "resource": {"const": entry["resource"]},
        "resource_id": {"type": "null"} if truncate else _column(entry, entry["id_column"]),
    }
    required = ["id", "name", "resource", "resource_id", "user_id", "occurred_at"]
    if entry["parent_resource"] is not None:
        properties["parent"] = {
            "type": "object", "additionalProperties": False,
            "required": ["resource", "resource_id"],
            "properties": {"resource": {"const": entry["parent_resource"]},
                           "resource_id": ({"type": "null"} if truncate
                                           else _column(entry, entry["parent_column"]))}}
        required.insert(4, "parent")
    properties["user_id"] = {
        "type": "string",
        "description": "the writing transaction's webhooks.user_id, else the user column's"
                       " value, else the database role"}
    if verb == "snapshot":  # a backfill's row: no writing transaction or role
        properties["user_id"] = {"type": ["string", "null"],
                                 "description": "the user column's value, else null"}
    properties["occurred_at"] = OCCURRED_AT
    if verb == "update":
        names = [c["name"] for c in sent_columns(entry)]
        properties["changed"] = {
            "type": "array", "description": "the columns whose values changed, in table order",
            "items": {"type": "string", "enum": names} if names else {"type": "string"},
            **({} if names else {"maxItems": 0})}
        required.append("changed")
    return {"type": "object", "additionalProperties": False, "required": required,
            "properties": properties}


def table_body(entry: dict[str, Any], row: Schema) -> Schema:
    """The body of an event of an attached table whose row is `row` (row_schema)."""
    verb = entry["event"].rpartition(".")[2]
    properties: Schema = {"event": event_member(entry, verb)}
    body: Schema = {"type": "object", "additionalProperties": False, "required": ["event"],
                    "properties": properties}
    if verb == "truncate" or not entry["include_row"]:
        return body
    too_large = {"const": "too_large",
                 "description": "sent instead of the row when it is over WEBHOOKS_MAX_ROW_BYTES"}
    properties["resource"] = row
    properties["resource_omitted"] = too_large
    body["oneOf"] = [{"required": ["resource"]}, {"required": ["resource_omitted"]}]
    if verb == "update" and entry["include_previous"]:
        # The row as it was; absent when the update changed the row's key.
        properties["previous"] = row
        properties["previous_omitted"] = too_large
        body["not"] = {"required": ["previous", "previous_omitted"]}
    return body


def subscription_schema() -> Schema:
    """A subscription as the REST API shows it (the `resource` of webhook.* events)."""
    _, defs = msgspec.json.schema_components([Subscription])
    return dict(defs["Subscription"])


def service_body(event: str) -> Schema:
    """The body of one of the service's own events: webhook.failing, .recovered,
    .disabled (about a subscription, which is their `resource`) and webhook.test."""
    test = event == "webhook.test"
    member: Schema = {
        "type": "object", "additionalProperties": False,
        "required": ["id", "name", "resource", "resource_id", "user_id", "occurred_at"],
        "properties": {
            "id": {"type": "integer", "minimum": 1}, "name": {"const": event},
            "resource": {"const": "webhooks"},
            "resource_id": {"type": "integer", "description": "the subscription's id"},
            "user_id": ({"type": "string", "description": "the owner of the token"} if test
                        else {"type": "null"}),
            "occurred_at": OCCURRED_AT}}
    body: Schema = {"type": "object", "additionalProperties": False, "required": ["event"],
                    "properties": {"event": member}}
    if not test:
        body["properties"]["resource"] = subscription_schema()
        body["required"].append("resource")
    return body


def event_schema(entry: dict[str, Any], row: Schema | None = None) -> Schema:
    """The JSON Schema of the whole delivery body of `entry["event"]` (an api_event_catalog
    row's table, or a service event when it has no `resource`)."""
    event = entry["event"]
    body = (service_body(event) if entry["resource"] is None
            else table_body(entry, row_schema(entry) if row is None else row))
    return {"$schema": DIALECT, "title": event,
            "description": f"The body of a {event} delivery, exactly as sent", **body}


COLUMN_FIELDS = ("name", "not_null", "type", "base", "kind", "typmod", "array", "builtin",
                 "labels")


def table_schemas(table: dict[str, Any]) -> dict[str, Schema]:
    """The schema of each event of one api_event_catalog row, and of the backfill's
    `<noun>.snapshot` of a table."""
    if table["resource"] is None:
        return {e: event_schema({**table, "event": e}) for e in table["events"]}
    table = {**table, "columns": [dict(zip(COLUMN_FIELDS, c, strict=True))
                                  for c in msgspec.json.decode(table["columns"] or "[]")]}
    row = row_schema(table)  # one object, shared by the events of the table
    noun = table["events"][0].rpartition(".")[0]
    return {e: event_schema({**table, "event": e}, row)
            for e in [*table["events"], f"{noun}.snapshot"]}


# The encoded schemas of each table (by hook resource and resource) as the catalog last
# described it, its columns as JSON text included: a table whose columns or attachment
# change is built again, one no longer attached is dropped, so what is kept is what the
# answers hold.
_CACHE: dict[tuple[str, str | None], tuple[tuple[Any, ...], dict[str, msgspec.Raw]]] = {}


def encoded(table: dict[str, Any]) -> dict[str, msgspec.Raw]:
    """table_schemas(table), each encoded as JSON, from the cache when nothing changed."""
    name = (table["hook_resource"], table["resource"])
    key = tuple(tuple(v) if isinstance(v, list) else v for v in table.values())
    held = _CACHE.get(name)
    if held is None or held[0] != key:
        held = key, {e: msgspec.Raw(msgspec.json.encode(s))
                     for e, s in table_schemas(table).items()}
        _CACHE[name] = held
    return held[1]


def event_schemas(tables: list[dict[str, Any]], snapshots: bool = False
                  ) -> list[tuple[str, str, msgspec.Raw]]:
    """(resource, event, encoded schema) of every listed event of api_event_catalog's rows
    (and every table's `<noun>.snapshot` with `snapshots`), by resource and event."""
    attached = {(t["hook_resource"], t["resource"]) for t in tables}
    for name in [n for n in _CACHE if n[1] is not None and n not in attached]:
        del _CACHE[name]
    found = [(t["hook_resource"], event, schema) for t in tables
             for event, schema in encoded(t).items()
             if snapshots or event in t["events"]]
    return sorted(found, key=lambda f: (f[0], f[1]))


def hook_events_json(tables: list[dict[str, Any]]) -> bytes:
    """GET /hook_events' answer: [{"resource", "event", "schema"}], compact JSON."""
    return b"[" + b",".join(
        b'{"resource":' + msgspec.json.encode(r) + b',"event":' + msgspec.json.encode(e)
        + b',"schema":' + bytes(s) + b"}"
        for r, e, s in event_schemas(tables)) + b"]"
