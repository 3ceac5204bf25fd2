"""Configuration: every setting comes from a WEBHOOKS_* environment variable (or DATABASE_URL)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:54329/postgres"
DEFAULT_RETRY_SCHEDULE = "5s,5m,30m,2h,5h,10h,10h,10h"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


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


def _bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be true or false, not {text!r}")


def _number(name: str, text: str, minimum: float = 0.0) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {text!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum:g}, not {text!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """Everything the processes read from their environment, parsed and checked once."""

    database_url: str = DEFAULT_DATABASE_URL
    allow_private_targets: bool = False
    retry_schedule: tuple[float, ...] = field(
        default_factory=lambda: parse_schedule(DEFAULT_RETRY_SCHEDULE)
    )
    delivery_timeout: float = 10.0
    verify_timeout: float = 10.0
    concurrency: int = 64
    per_target_concurrency: int = 8
    # Deliveries in flight per owner in one worker; None: half of the worker's concurrency.
    per_owner_concurrency: int | None = None
    # Name lookups of targets: their own timeout; the system's name servers unless given.
    dns_timeout: float = 5.0
    dns_servers: tuple[str, ...] = ()
    poll_interval: float = 5.0
    lease: float = 60.0
    batch_size: int = 100
    retry_after_cap: float = 3600.0
    pool_size: int = 10
    log_format: str = "text"
    log_level: str = "INFO"
    shutdown_grace: float = 10.0
    retention: float = 7 * 86400.0
    encryption_key: str | None = None
    max_row_bytes: int = 256 * 1024
    # API limits: each refused with a clear {"error"} and nothing changed.
    max_body_bytes: int = 65536
    max_subscriptions_per_owner: int = 1000
    max_events_per_subscription: int = 100
    max_target_length: int = 2048
    # Requests per second per API token, per API process, with bursts of rate_burst; 0 = off.
    rate_limit: float = 100.0
    rate_burst: int = 200

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from `env` (default: os.environ); raises ConfigError naming a bad variable."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(name)
            return value if value is not None and value.strip() != "" else None

        kwargs: dict[str, object] = {}
        if (url := get("DATABASE_URL")) is not None:
            kwargs["database_url"] = url
        if (v := get("WEBHOOKS_ALLOW_PRIVATE_TARGETS")) is not None:
            kwargs["allow_private_targets"] = _bool("WEBHOOKS_ALLOW_PRIVATE_TARGETS", v)
        if (v := get("WEBHOOKS_RETRY_SCHEDULE")) is not None:
            try:
                kwargs["retry_schedule"] = parse_schedule(v)
            except ConfigError as exc:
                raise ConfigError(f"WEBHOOKS_RETRY_SCHEDULE: {exc}") from None
        numbers = {
            "WEBHOOKS_DELIVERY_TIMEOUT": ("delivery_timeout", 0.001),
            "WEBHOOKS_VERIFY_TIMEOUT": ("verify_timeout", 0.001),
            "WEBHOOKS_DNS_TIMEOUT": ("dns_timeout", 0.01),
            "WEBHOOKS_POLL_INTERVAL": ("poll_interval", 0.01),
            "WEBHOOKS_LEASE": ("lease", 1.0),
            "WEBHOOKS_RETRY_AFTER_CAP": ("retry_after_cap", 0.0),
            "WEBHOOKS_SHUTDOWN_GRACE": ("shutdown_grace", 0.0),
            "WEBHOOKS_RATE_LIMIT": ("rate_limit", 0.0),
        }
        for name, (attr, minimum) in numbers.items():
            if (v := get(name)) is not None:
                kwargs[attr] = _number(name, v, minimum)
        if (v := get("WEBHOOKS_DNS_SERVERS")) is not None:
            kwargs["dns_servers"] = tuple(p for p in (s.strip() for s in v.split(",")) if p)
        if (v := get("WEBHOOKS_RETENTION")) is not None:
            try:
                kwargs["retention"] = parse_duration(v)
            except ConfigError as exc:
                raise ConfigError(f"WEBHOOKS_RETENTION: {exc}") from None
        integers = {
            "WEBHOOKS_CONCURRENCY": "concurrency",
            "WEBHOOKS_PER_TARGET_CONCURRENCY": "per_target_concurrency",
            "WEBHOOKS_PER_OWNER_CONCURRENCY": "per_owner_concurrency",
            "WEBHOOKS_BATCH_SIZE": "batch_size",
            "WEBHOOKS_POOL_SIZE": "pool_size",
            "WEBHOOKS_MAX_ROW_BYTES": "max_row_bytes",
            "WEBHOOKS_MAX_BODY_BYTES": "max_body_bytes",
            "WEBHOOKS_MAX_SUBSCRIPTIONS_PER_OWNER": "max_subscriptions_per_owner",
            "WEBHOOKS_MAX_EVENTS_PER_SUBSCRIPTION": "max_events_per_subscription",
            "WEBHOOKS_MAX_TARGET_LENGTH": "max_target_length",
            "WEBHOOKS_RATE_BURST": "rate_burst",
        }
        for name, attr in integers.items():
            if (v := get(name)) is not None:
                number = _number(name, v, 1)
                if number != int(number):
                    raise ConfigError(f"{name} must be a whole number, not {v!r}")
                kwargs[attr] = int(number)
        if (v := get("WEBHOOKS_ENCRYPTION_KEY")) is not None:
            from service.crypto import SecretBox

            try:
                SecretBox(v)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            kwargs["encryption_key"] = v
        if (v := get("WEBHOOKS_LOG_FORMAT")) is not None:
            if v not in ("text", "json"):
                raise ConfigError(f"WEBHOOKS_LOG_FORMAT must be text or json, not {v!r}")
            kwargs["log_format"] = v
        if (v := get("WEBHOOKS_LOG_LEVEL")) is not None:
            kwargs["log_level"] = v.upper()
        return cls(**kwargs)  # type: ignore[arg-type]
