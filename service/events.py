"""Event names of subscriptions: parsing, canonicalising and checking against the registry.

Pure functions; the caller loads the registry rows (`webhooks.hook_events`) and the
resource's own noun (`webhooks.attachments.noun` of the attachment whose resource is the
subscription's resource) and passes them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# Verbs integrators may write, mapped to the verb the triggers emit. `destroy` is the
# Rails-style name that appears in samples of the seed.
VERB_ALIASES: dict[str, str] = {"destroy": "delete"}

# Bounds that keep error messages and stored rows small whatever a client sends.
MAX_EVENTS_LENGTH = 4096
_SHOWN = 60


class EventsError(ValueError):
    """The events string cannot be used; the message says which name and why."""


def _shown(text: str) -> str:
    """A client-supplied name quoted for an error message, cut to a readable length."""
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def canonical_name(name: str, own_noun: str | None) -> str:
    """The canonical `noun.verb` of one name: aliases resolved, bare verbs given `own_noun`."""
    noun, dot, verb = name.rpartition(".")
    verb = VERB_ALIASES.get(verb, verb)
    if not dot:
        if own_noun is None:
            raise EventsError(f"event {_shown(name)} is a bare verb, but this resource has no "
                              "events of its own noun; use full names such as payment.create")
        return f"{own_noun}.{verb}"
    if not noun or not verb:
        raise EventsError(f"event {_shown(name)} is not of the form noun.verb")
    return f"{noun}.{verb}"


def parse(text: str, own_noun: str | None, max_events: int | None = None) -> list[str]:
    """Canonical names of a comma-separated list, in order of first appearance, no duplicates.

    Blanks around names are ignored, as are empty items; raises EventsError when no name
    remains, a name cannot be read, or more than `max_events` distinct names remain.
    """
    if len(text) > MAX_EVENTS_LENGTH:
        raise EventsError(f"events is longer than {MAX_EVENTS_LENGTH} characters")
    names: dict[str, None] = {}
    for item in text.split(","):
        item = item.strip()
        if item:
            names.setdefault(canonical_name(item, own_noun), None)
    if not names:
        raise EventsError("events is empty: name at least one event, e.g. invoice.create")
    if max_events is not None and len(names) > max_events:
        raise EventsError(f"events names {len(names)} different events; a subscription may "
                          f"have at most {max_events} (WEBHOOKS_MAX_EVENTS_PER_SUBSCRIPTION)")
    return list(names)


def check(names: Iterable[str], registry: Mapping[str, bool], resource: str) -> None:
    """Raises EventsError unless every name is a public event of `resource`.

    `registry` maps each event registered under the resource to whether it is public.
    """
    available = ", ".join(sorted(e for e, public in registry.items() if public))
    for name in names:
        public = registry.get(name)
        if public is None:
            raise EventsError(f"event {_shown(name)} is not an event of resource "
                              f"{_shown(resource)}; available: {available or 'none'}")
        if not public:
            raise EventsError(f"event {_shown(name)} of resource {_shown(resource)} is not "
                              f"public; available: {available or 'none'}")


def canonicalise(text: str, own_noun: str | None, registry: Mapping[str, bool],
                 resource: str, max_events: int | None = None) -> list[str]:
    """The canonical, checked event names of an `events` string (see `parse` and `check`)."""
    names = parse(text, own_noun, max_events)
    check(names, registry, resource)
    return names


def format_events(names: Iterable[str]) -> str:
    """The comma-separated form of event names that the API returns."""
    return ",".join(names)
