"""Event-name canonicalisation: pure functions, no database."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service import events

REGISTRY = {
    "invoice.create": True, "invoice.update": True, "invoice.delete": True,
    "payment.create": True, "payment.update": True, "payment.delete": True,
    "refund.create": False,
}


@pytest.mark.parametrize(("text", "expected"), [
    ("invoice.create", ["invoice.create"]),
    ("create", ["invoice.create"]),
    ("destroy", ["invoice.delete"]),
    ("payment.destroy", ["payment.delete"]),
    (" create , update ,delete ", ["invoice.create", "invoice.update", "invoice.delete"]),
    ("update,invoice.update,update", ["invoice.update"]),
    ("delete,destroy,invoice.destroy", ["invoice.delete"]),
    ("payment.create,create", ["payment.create", "invoice.create"]),
    ("create,,update,", ["invoice.create", "invoice.update"]),
    ("\tcreate\n", ["invoice.create"]),
])
def test_canonicalise(text: str, expected: list[str]) -> None:
    assert events.canonicalise(text, "invoice", REGISTRY, "invoices") == expected


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "empty"),
    (" , ,", "empty"),
    ("order.create", "not an event of resource 'invoices'"),
    ("invoice.explode", "not an event of resource"),
    ("refund.create", "not public"),
    (".create", "noun.verb"),
    ("invoice.", "noun.verb"),
    ("Invoice.Create", "not an event"),
    ("x" * 5000, "longer than"),
])
def test_rejects(text: str, fragment: str) -> None:
    with pytest.raises(events.EventsError) as info:
        events.canonicalise(text, "invoice", REGISTRY, "invoices")
    assert fragment in str(info.value)


def test_error_lists_only_public_events() -> None:
    with pytest.raises(events.EventsError) as info:
        events.canonicalise("nope.create", "invoice", REGISTRY, "invoices")
    assert "invoice.create" in str(info.value)
    assert "refund.create" not in str(info.value)


def test_bare_verb_without_own_noun() -> None:
    with pytest.raises(events.EventsError, match="bare verb"):
        events.parse("create", None)
    assert events.parse("payment.create", None) == ["payment.create"]


def test_long_names_are_cut_in_messages() -> None:
    with pytest.raises(events.EventsError) as info:
        events.canonicalise("a" * 1000 + ".create", "invoice", REGISTRY, "invoices")
    assert len(str(info.value)) < 400


def test_format_events() -> None:
    assert events.format_events(["invoice.create", "payment.delete"]) == \
        "invoice.create,payment.delete"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_parses_or_raises_events_error(text: str) -> None:
    try:
        names = events.canonicalise(text, "invoice", REGISTRY, "invoices")
    except events.EventsError as exc:
        assert str(exc)
    else:
        assert names and len(names) == len(set(names))
        assert all(REGISTRY[n] for n in names)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["create", "update", "delete", "destroy", "invoice.create",
                                 "payment.destroy", "payment.update"]), min_size=1),
       st.sampled_from([",", " ,", ", ", " , "]))
def test_canonical_form_is_a_fixed_point(names: list[str], sep: str) -> None:
    first = events.canonicalise(sep.join(names), "invoice", REGISTRY, "invoices")
    again = events.canonicalise(events.format_events(first), "invoice", REGISTRY, "invoices")
    assert again == first
