"""The OpenAPI document describes each request body with every constraint of its declared
type: Litestar leaves out those of a union's members (the string or array of `events`),
which service.api.bodies copies from msgspec's own schema of the type."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from service.api.app import create_app
from service.api.backfills import BackfillRequest
from service.api.deliveries import Recover
from service.api.models import CreateSubscription, UpdateSubscription
from service.config import Settings

KEYWORDS = ("pattern", "minLength", "maxLength", "minItems", "maxItems", "minimum", "maximum")


def constraints(schema: Any) -> set[tuple[str, str]]:
    """Every constraint keyword and value anywhere in `schema`."""
    found: set[tuple[str, str]] = set()
    if isinstance(schema, dict):
        found |= {(k, repr(schema[k])) for k in KEYWORDS if k in schema}
        for value in schema.values():
            found |= constraints(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= constraints(value)
    return found


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    app = create_app(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"))
    return app.openapi_schema.to_schema()


@pytest.mark.parametrize("body", [CreateSubscription, UpdateSubscription, Recover,
                                  BackfillRequest])
def test_every_declared_constraint_is_in_the_document(document: dict[str, Any],
                                                      body: type[msgspec.Struct]) -> None:
    (_,), components = msgspec.json.schema_components([body])
    declared = components[body.__name__]["properties"]
    described = document["components"]["schemas"][body.__name__]["properties"]
    for name, schema in declared.items():
        assert constraints(schema) <= constraints(described[name]), name


def test_events_says_what_each_form_holds(document: dict[str, Any]) -> None:
    events = document["components"]["schemas"]["CreateSubscription"]["properties"]["events"]
    text, names = events["oneOf"]
    assert text["type"] == "string" and "pattern" in text
    assert names["type"] == "array" and names["minItems"] == 1
    assert "," in names["items"]["pattern"]
