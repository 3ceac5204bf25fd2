"""Configuration: every setting comes from a WEBHOOKS_* environment variable (or DATABASE_URL).

Each field of `Settings` names its variable, its parser and its default in one place
(`setting(...)`); `Settings.from_env` walks the fields, so a new setting is one line here
and one row in the README's configuration table (a test checks the two agree).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:54329/postgres"
DEFAULT_RETRY_SCHEDULE = "5s,5m,30m,2h,5h,10h,10h,10h"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}

# A parser gets the variable's name (for its error messages) and its non-blank text.
Parser = Callable[[str, str], Any]


class ConfigError(ValueError):
    """A setting has a value the service cannot use; the message names the variable."""


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `5s`, `30m`, `2h`, `1d`, `250ms` or a bare number."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(f"not a duration: {text!r} (use forms like 5s, 5m, 2h, 1d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_schedule(text: str) -> tuple[float, ...]:
    """The retry delays, in seconds, of a comma-separated list of durations."""
    parts = [p for p in (s.strip() for s in text.split(",")) if p]
    if not parts:
        raise ConfigError("WEBHOOKS_RETRY_SCHEDULE is empty: give at least one duration")
    return tuple(parse_duration(p) for p in parts)


# Parsers, one per kind of value.


def text(name: str, value: str) -> str:
    """The value as given."""
    return value


def upper(name: str, value: str) -> str:
    """The value in capitals (log levels)."""
    return value.upper()


def boolean(name: str, value: str) -> bool:
    """true/false, yes/no, on/off, 1/0, in any case."""
    word = value.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def number(minimum: float) -> Parser:
    """A parser of numbers no smaller than `minimum`."""

    def parse(name: str, value: str) -> float:
        try:
            result = float(value)
        except ValueError:
            raise ConfigError(f"{name} must be a number, not {value!r}") from None
        if result < minimum:
            raise ConfigError(f"{name} must be at least {minimum:g}, not {value!r}")
        return result

    return parse


def whole(name: str, value: str) -> int:
    """A whole number, at least 1 (a count or a size)."""
    result = number(1)(name, value)
    if not math.isfinite(result) or result != int(result):
        raise ConfigError(f"{name} must be a whole number, not {value!r}")
    return int(result)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.I)
_SIZE_UNITS = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def size(name: str, value: str) -> int:
    """Bytes of a size such as `512MB`, `1GiB`, `300m` (units of 1024; a bare number is
    megabytes)."""
    match = _SIZE.match(value)
    if not match:
        raise ConfigError(f"{name} must be a size such as 512MB or 1GB, not {value!r}")
    unit = (match.group(2) or "m")[0].lower()
    result = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if result < 1 << 20:
        raise ConfigError(f"{name} must be at least 1MB, not {value!r}")
    return result


def duration(name: str, value: str) -> float:
    """Seconds of a duration with a unit suffix (see parse_duration)."""
    try:
        return parse_duration(value)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def positive_duration(name: str, value: str) -> float:
    """A duration (see parse_duration) longer than zero: a deadline or an interval."""
    seconds = duration(name, value)
    if seconds <= 0:
        raise ConfigError(f"{name} must be longer than 0, not {value!r}")
    return seconds


def schedule(name: str, value: str) -> tuple[float, ...]:
    """Seconds of a comma-separated list of durations (see parse_schedule)."""
    try:
        return parse_schedule(value)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def comma_list(name: str, value: str) -> tuple[str, ...]:
    """The non-blank items of a comma-separated list."""
    return tuple(p for p in (s.strip() for s in value.split(",")) if p)


def one_of(*choices: str) -> Parser:
    """A parser that accepts only `choices`, exactly as written."""

    def parse(name: str, value: str) -> str:
        if value not in choices:
            raise ConfigError(f"{name} must be {' or '.join(choices)}, not {value!r}")
        return value

    return parse


def pem_file(name: str, value: str) -> str:
    """The path of a readable file of PEM certificates."""
    try:
        with open(value, "rb") as f:
            head = f.read(1 << 20)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {value!r}: {exc.strerror or exc}") from None
    if b"-----BEGIN CERTIFICATE-----" not in head:
        raise ConfigError(f"{name}: {value!r} holds no PEM certificate")
    return value


def proxy_url(name: str, value: str) -> str:
    """An http:// proxy URL, `http://[user:password@]host[:port]`; its password is masked in
    every message from now on. Errors never repeat the value (it may hold the password)."""
    from urllib.parse import urlsplit

    from service.logs import protect_url

    protect_url(value)
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 (raises ValueError for a port that is not one)
    except ValueError:
        parts = None
    if parts is None or parts.scheme != "http" or not parts.hostname \
            or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"{name} must be an http:// proxy URL such as "
                          "http://user:password@proxy.example:3128 (CONNECT is used for "
                          "http and https targets alike)")
    return value.strip()


def fernet_keys(name: str, value: str) -> str:
    """One or more comma-separated Fernet keys, checked by building the SecretBox."""
    from service.crypto import SecretBox

    try:
        SecretBox(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return value


def postgres_url(name: str, value: str) -> str:
    """A postgresql:// (or postgres://) URI that libpq can parse."""
    from psycopg.conninfo import conninfo_to_dict

    scheme = value.partition("://")[0] if "://" in value else ""
    if scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"{name} is not a PostgreSQL URI (use the form "
                          "postgresql://user:password@host:5432/dbname)")
    try:
        conninfo_to_dict(value)
    except Exception as exc:  # psycopg.ProgrammingError: what libpq says is wrong
        # libpq quotes the URI, or the fragment it could not read, which may hold the
        # password or a part of it.
        from service.logs import password_pieces, scrub

        reason = scrub(str(exc).strip().replace(value, "..."), password_pieces(value))
        raise ConfigError(f"{name} is not a valid PostgreSQL URI: {reason}") from None
    return value


# What a worker process holds before its deliveries, and what each delivery in flight adds
# (its claim and body, its sender, its transfer and connection: measured in `make bench`'s
# slow_targets), from which the default WEBHOOKS_CONCURRENCY follows.
WORKER_BASE_BYTES = 128 << 20
DELIVERY_BYTES = 64 << 10


def ceiling_for(memory_budget: int) -> int:
    """The default ceiling of a worker's deliveries in flight within `memory_budget`."""
    return max(64, (memory_budget - WORKER_BASE_BYTES) // DELIVERY_BYTES)


def setting(env: str, parse: Parser, default: Any) -> Any:
    """A Settings field read from the environment variable `env` with `parse`."""
    return field(default=default, metadata={"env": env, "parse": parse})


@dataclass(frozen=True)
class Settings:
    """Everything the processes read from their environment, parsed and checked once."""

    database_url: str = setting("DATABASE_URL", postgres_url, DEFAULT_DATABASE_URL)
    allow_private_targets: bool = setting("WEBHOOKS_ALLOW_PRIVATE_TARGETS", boolean, False)
    retry_schedule: tuple[float, ...] = setting(
        "WEBHOOKS_RETRY_SCHEDULE", schedule, parse_schedule(DEFAULT_RETRY_SCHEDULE)
    )
    delivery_timeout: float = setting("WEBHOOKS_DELIVERY_TIMEOUT", number(0.001), 10.0)
    verify_timeout: float = setting("WEBHOOKS_VERIFY_TIMEOUT", number(0.001), 10.0)
    # The most deliveries in flight per worker process: the ceiling of its adaptive
    # capacity (service/worker/capacity.py); 0, the default: derived from memory_budget.
    concurrency: int = setting("WEBHOOKS_CONCURRENCY", whole, 0)
    # What the worker process may hold in memory (its RSS): its capacity grows no further
    # and shrinks past it.
    memory_budget: int = setting("WEBHOOKS_MEMORY_BUDGET", size, 320 << 20)
    # The most a subscription's adaptive window may grow to (service/worker/slots.py).
    per_target_concurrency: int = setting("WEBHOOKS_PER_TARGET_CONCURRENCY", whole, 64)
    # Deliveries in flight per owner in one worker; None: half of the worker's concurrency.
    per_owner_concurrency: int | None = setting("WEBHOOKS_PER_OWNER_CONCURRENCY", whole, None)
    # Name lookups of targets: their own timeout; the system's name servers unless given.
    dns_timeout: float = setting("WEBHOOKS_DNS_TIMEOUT", number(0.01), 5.0)
    dns_servers: tuple[str, ...] = setting("WEBHOOKS_DNS_SERVERS", comma_list, ())
    # CA certificates trusted for https targets besides the system's (deliveries and
    # verification handshakes).
    ca_bundle: str | None = setting("WEBHOOKS_CA_BUNDLE", pem_file, None)
    # An HTTP proxy every delivery and verification handshake goes through, by CONNECT to
    # the address the SSRF guard checked (docs/deliveries.md, "Through a proxy").
    delivery_proxy: str | None = field(default=None, repr=False, metadata={
        "env": "WEBHOOKS_DELIVERY_PROXY", "parse": proxy_url})
    poll_interval: float = setting("WEBHOOKS_POLL_INTERVAL", number(0.01), 5.0)
    lease: float = setting("WEBHOOKS_LEASE", number(1.0), 60.0)
    batch_size: int = setting("WEBHOOKS_BATCH_SIZE", whole, 100)
    retry_after_cap: float = setting("WEBHOOKS_RETRY_AFTER_CAP", number(0.0), 3600.0)
    pool_size: int = setting("WEBHOOKS_POOL_SIZE", whole, 10)
    log_format: str = setting("WEBHOOKS_LOG_FORMAT", one_of("text", "json"), "text")
    log_level: str = setting("WEBHOOKS_LOG_LEVEL", upper, "INFO")
    shutdown_grace: float = setting("WEBHOOKS_SHUTDOWN_GRACE", number(0.0), 10.0)
    retention: float = setting("WEBHOOKS_RETENTION", duration, 7 * 86400.0)
    encryption_key: str | None = setting("WEBHOOKS_ENCRYPTION_KEY", fernet_keys, None)
    max_row_bytes: int = setting("WEBHOOKS_MAX_ROW_BYTES", whole, 256 * 1024)
    # How many snapshot deliveries a backfill may queue ahead of its target's deliveries.
    backfill_ahead: int = setting("WEBHOOKS_BACKFILL_AHEAD", whole, 5000)
    # How many backfills one owner may run at once (more are refused with a 409).
    max_backfills_per_owner: int = setting("WEBHOOKS_MAX_BACKFILLS_PER_OWNER", whole, 3)
    # API limits: each refused with a clear {"error"} and nothing changed.
    max_body_bytes: int = setting("WEBHOOKS_MAX_BODY_BYTES", whole, 65536)
    max_subscriptions_per_owner: int = setting(
        "WEBHOOKS_MAX_SUBSCRIPTIONS_PER_OWNER", whole, 1000
    )
    max_events_per_subscription: int = setting(
        "WEBHOOKS_MAX_EVENTS_PER_SUBSCRIPTION", whole, 100
    )
    max_target_length: int = setting("WEBHOOKS_MAX_TARGET_LENGTH", whole, 2048)
    # What one owner's active filters may compile to in all: fan-out evaluates each of
    # them for every change their events match, so this bounds what one owner adds to
    # every change's fan-out (README, Limits).
    max_filter_bytes_per_owner: int = setting(
        "WEBHOOKS_MAX_FILTER_BYTES_PER_OWNER", whole, 262144
    )
    # A list page stops early once its JSON passes this many bytes (its Link goes on).
    max_page_bytes: int = setting("WEBHOOKS_MAX_PAGE_BYTES", whole, 1048576)
    # Requests per second per API token, per API process, with bursts of rate_burst; 0 = off.
    rate_limit: float = setting("WEBHOOKS_RATE_LIMIT", number(0.0), 100.0)
    rate_burst: int = setting("WEBHOOKS_RATE_BURST", whole, 200)
    # The failure lifecycle: webhook.failing after failing_after of unbroken
    # failure, auto-disable after disable_after (0 = never); a rotated-out secret still
    # signs for secret_overlap.
    failing_after: float = setting("WEBHOOKS_FAILING_AFTER", duration, 3600.0)
    disable_after: float = setting("WEBHOOKS_DISABLE_AFTER", duration, 5 * 86400.0)
    secret_overlap: float = setting("WEBHOOKS_SECRET_OVERLAP", duration, 86400.0)
    # Database connections (docs/operations.md, "When the database stops answering"): how
    # long a connection may go without the server's acknowledgement before the kernel
    # drops it (keepalives and tcp_user_timeout), how long a new one may take, and the
    # client-side deadlines of each kind of work, a statement and a pool checkout each.
    db_tcp_timeout: float = setting("WEBHOOKS_DB_TCP_TIMEOUT", positive_duration, 15.0)
    db_connect_timeout: float = setting("WEBHOOKS_DB_CONNECT_TIMEOUT", positive_duration, 5.0)
    # 8 s: with the rest of its work, a request is answered within 10 s.
    api_db_timeout: float = setting("WEBHOOKS_API_DB_TIMEOUT", positive_duration, 8.0)
    worker_db_timeout: float = setting("WEBHOOKS_WORKER_DB_TIMEOUT", positive_duration, 10.0)
    maintenance_db_timeout: float = setting("WEBHOOKS_MAINTENANCE_DB_TIMEOUT",
                                            positive_duration, 600.0)
    backfill_db_timeout: float = setting("WEBHOOKS_BACKFILL_DB_TIMEOUT", positive_duration, 120.0)
    migrate_db_timeout: float = setting("WEBHOOKS_MIGRATE_DB_TIMEOUT", positive_duration, 3600.0)
    # The worker proves its LISTEN connection alive this often; its liveness check fails
    # after this long without a completed round while the database answers and work is due.
    listen_check_interval: float = setting("WEBHOOKS_LISTEN_CHECK_INTERVAL",
                                           positive_duration, 10.0)
    liveness_timeout: float = setting("WEBHOOKS_LIVENESS_TIMEOUT", positive_duration, 120.0)

    def __post_init__(self) -> None:
        if self.delivery_proxy is not None:
            from service.logs import protect_url

            protect_url(self.delivery_proxy)  # its password in no log line or message
        if self.concurrency == 0:
            object.__setattr__(self, "concurrency", ceiling_for(self.memory_budget))

    @classmethod
    def variables(cls) -> Iterator[tuple[str, str, Parser, Any]]:
        """(variable, field name, parser, default) of every setting, in declaration order."""
        for f in fields(cls):
            yield f.metadata["env"], f.name, f.metadata["parse"], f.default

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from `env` (default: os.environ); raises ConfigError naming a bad variable.

        A variable that is unset or blank keeps its default.
        """
        env = os.environ if env is None else env
        kwargs: dict[str, Any] = {}
        for name, attr, parse, _ in cls.variables():
            value = env.get(name)
            if value is not None and value.strip() != "":
                kwargs[attr] = parse(name, value)
        return cls(**kwargs)
