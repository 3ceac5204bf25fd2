"""Request bodies: each is one declared type, a msgspec Struct (the subscription's in
models.py, recover's in deliveries.py, the backfill's in backfills.py), which `Body` hands
to its route as `data` and which the OpenAPI document describes.

Litestar's own decoding of a body is lax (strict=False: "false" would be a boolean and "20"
an integer), so `Body` decodes the raw bytes itself, strictly, against the declared type.
What a client got wrong becomes one message naming the field and the problem (`refusal`),
worded from the declared type; the handler of validation errors in errors.py answers it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import msgspec
from litestar.dto import MsgspecDTO
from litestar.exceptions import ValidationException
from litestar.openapi.spec import Reference, Schema
from litestar.typing import FieldDefinition
from msgspec import Meta, inspect

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator
    from litestar.dto._backend import DTOBackend

T = TypeVar("T", bound=msgspec.Struct)

# PostgreSQL's text cannot hold NUL characters.
NO_NUL = r"^[^\u0000]*$"
# One event name of a list: no comma (the stored form is comma-separated), no NUL.
ONE_EVENT = r"^[^,\u0000]*$"
Text = Annotated[str, Meta(pattern=NO_NUL)]
EventName = Annotated[str, Meta(pattern=ONE_EVENT)]
# What a string that does not match its pattern is told.
PATTERNS = {NO_NUL: "must not contain NUL characters", ONE_EVENT: "each item names one event"}

EMPTY = "request body is empty: send a JSON object"
# What a time, in a body or a query parameter, must be.
TIMESTAMP = "an RFC 3339 timestamp with a time zone, such as 2026-11-20T08:00:00Z"
_SHOWN = 60
# The end of a msgspec error naming where it is: " - at `$.events[0]`".
_AT = re.compile(r" - at `\$\.(?P<name>[^`\[.]+)(?:\[(?P<index>\d+)\])?[^`]*`$")
# A msgspec error about the JSON type: "Expected `int | null`, got `str`".
_GOT = re.compile(r"^Expected `[^`]*`, got `(?P<got>\w+)`")
_KINDS = {"str": "a string", "int": "a number", "float": "a number", "bool": "a boolean",
          "null": "null", "array": "an array", "object": "an object"}


def shown(text: str) -> str:
    """A client-supplied value quoted for a message, cut to a readable length."""
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class BodyRefused(ValidationException):
    """A request body that is not its declared type; `refusal` says why."""

    def __init__(self, body_type: type[msgspec.Struct], raw: bytes, error: Exception) -> None:
        super().__init__(detail="invalid request body")
        self.body_type, self.raw, self.error = body_type, raw, error


class Body(MsgspecDTO[T]):
    """A route's `data`: `Body[SomeStruct]` decodes the request body strictly as SomeStruct
    (any content type; nothing but the declared fields), or raises BodyRefused. The OpenAPI
    document describes SomeStruct itself: its fields, its docstring, no other field."""

    @classmethod
    def create_for_field_definition(cls, field_definition: FieldDefinition, handler_id: str,
                                    backend_cls: type[DTOBackend] | None = None) -> None:
        """Nothing to prepare: the declared type is decoded as it is, with no transfer model."""

    @classmethod
    def create_openapi_schema(cls, field_definition: FieldDefinition, handler_id: str,
                              schema_creator: SchemaCreator) -> Reference | Schema:
        """The declared type's schema (a component), which refuses other fields."""
        declared = FieldDefinition.from_annotation(cls.model_type)
        result = schema_creator.for_field_definition(declared)
        schema = (schema_creator.schema_registry.from_reference(result).schema
                  if isinstance(result, Reference) else result)
        schema.additional_properties = False
        schema.required = schema.required or None  # no field is required: no list
        schema.description = " ".join((cls.model_type.__doc__ or "").split()) or None
        (_,), components = msgspec.json.schema_components([cls.model_type])
        declared_fields = components[cls.model_type.__name__].get("properties", {})
        for name, prop in (schema.properties or {}).items():
            _fold_single_choice(prop)
            _constrain_choices(prop, declared_fields.get(name, {}))
        return result

    def decode_bytes(self, value: bytes) -> T:
        """The body as the declared type; BodyRefused when it is not one."""
        try:
            return msgspec.json.decode(value, type=self.model_type)
        except (msgspec.DecodeError, RecursionError) as exc:  # ValidationError included
            raise BodyRefused(self.model_type, value, exc) from None


# JSON Schema's constraint keywords and the names of Litestar's Schema fields for them.
_CONSTRAINTS = (("pattern", "pattern"), ("minLength", "min_length"),
                ("maxLength", "max_length"), ("minItems", "min_items"),
                ("maxItems", "max_items"), ("minimum", "minimum"), ("maximum", "maximum"))


def _constrain_choices(schema: Schema | Reference, declared: dict[str, Any]) -> None:
    """Litestar leaves out the constraints of a union's members (a string's pattern, an
    array's minItems and its items' pattern): they are copied from msgspec's own schema of
    the field (`declared`), member by member."""
    if not isinstance(schema, Schema) or not schema.one_of:
        return
    members = declared.get("anyOf") or []
    if len(members) != len(schema.one_of):
        return
    for ours, theirs in zip(schema.one_of, members, strict=True):
        if isinstance(ours, Schema):
            _copy_constraints(ours, theirs)


def _copy_constraints(schema: Schema, declared: dict[str, Any]) -> None:
    for keyword, field in _CONSTRAINTS:
        if keyword in declared and getattr(schema, field) is None:
            setattr(schema, field, declared[keyword])
    if isinstance(schema.items, Schema) and isinstance(declared.get("items"), dict):
        _copy_constraints(schema.items, declared["items"])


def _fold_single_choice(schema: Schema | Reference) -> None:
    """A field that may be left out (`X | UnsetType`) is described as X, not as a oneOf of
    X alone (Litestar leaves UNSET out of the choices)."""
    if not isinstance(schema, Schema) or not schema.one_of or len(schema.one_of) != 1:
        return
    [only] = schema.one_of
    if isinstance(only, Schema):
        schema.one_of = None
        for field in dataclasses.fields(only):
            if getattr(schema, field.name) is None:
                setattr(schema, field.name, getattr(only, field.name))


def refusal(refused: BodyRefused) -> str:
    """The first thing wrong with a request body, in the order the API promises: empty, not
    JSON, not an object, an unknown field, a missing one, then a field's value."""
    body_type, raw, error = refused.body_type, refused.raw, refused.error
    if not raw.strip():
        return EMPTY
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        return f"request body is not valid JSON: {exc}"
    if not isinstance(body, dict):
        return f"request body must be a JSON object, not {json_type(body)}"
    info = inspect.type_info(body_type)
    assert isinstance(info, inspect.StructType)
    names = [f.encode_name for f in info.fields]
    for key in body:
        if key not in names:
            if not names:
                return f"unknown field {shown(key)}: this request takes no fields, send {{}}"
            return f"unknown field {shown(key)}; allowed fields: {', '.join(names)}"
    missing = next((f.encode_name for f in info.fields
                    if f.required and f.encode_name not in body), None)
    if missing is not None:
        return f"missing field {missing!r}"
    text = str(error)
    at = _AT.search(text)
    field = next((f for f in info.fields if at and f.encode_name == at["name"]), None)
    if at is None or field is None:
        return f"invalid request body: {text}"
    return _field_problem(field, body[field.encode_name], at["index"], text[:at.start()])


def _field_problem(field: inspect.Field, value: Any, index: str | None, text: str) -> str:
    """What is wrong with one field's value, msgspec's `text` about it in the API's words."""
    name, got = field.encode_name, _GOT.match(text)
    if index is not None:  # an item of an array
        item = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
        if got:
            return f"field {name!r} must be {phrase(field.type, arrays=True)}; it holds " \
                   f"{_KINDS.get(got['got'], got['got'])}"
        return f"field {name!r}: {_pattern_says(text)}, not {shown(str(item))}"
    if got:
        return f"field {name!r} must be {phrase(field.type)}, not " \
               f"{_KINDS.get(got['got'], got['got'])}"
    if "matching regex" in text:
        return f"field {name!r} {_pattern_says(text)}"
    if isinstance(value, list) and not value:
        return f"field {name!r} must hold at least one item"
    return f"field {name!r} must be {phrase(field.type)}, not {shown(str(value))}"


def _pattern_says(text: str) -> str:
    # msgspec quotes the pattern as Python does.
    return next((says for pattern, says in PATTERNS.items() if repr(pattern) in text),
                "does not have the expected form")


def phrase(kind: Any, arrays: bool = False) -> str:
    """What a value of a declared type (msgspec.inspect) must be, in words: "a string or an
    array of strings", "an integer from 1 to 10,000 or null"; with `arrays`, only the arrays
    of a union."""
    if isinstance(kind, inspect.Metadata):
        return phrase(kind.type, arrays)
    if isinstance(kind, inspect.UnionType):
        arms = [t for t in kind.types
                if not arrays or isinstance(getattr(t, "type", t), inspect.ListType)]
        return " or ".join(phrase(t) for t in arms)
    if isinstance(kind, inspect.IntType):
        if kind.ge is not None and kind.le is not None:
            return f"an integer from {kind.ge:,} to {kind.le:,}"
        return "an integer"
    if isinstance(kind, inspect.ListType):
        item = phrase(kind.item_type)
        return "an array of " + ("strings" if item == "a string" else "values")
    if isinstance(kind, inspect.LiteralType):
        return "one of " + ", ".join(sorted(str(v) for v in kind.values))
    return _WORDS.get(type(kind), "a valid value")


_WORDS: dict[type, str] = {
    inspect.StrType: "a string", inspect.BoolType: "true or false", inspect.FloatType: "a number",
    inspect.DateTimeType: TIMESTAMP,
    inspect.NoneType: "null", inspect.DictType: "an object", inspect.AnyType: "any JSON value"}
