"""Settings: each variable declared once beside its field; docs/configuration.md's table
agrees; values are parsed and checked, and a bad one is refused by its name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.config import ConfigError, Settings
from tests.support.tls import TlsFiles, make_tls

TABLE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
_ROW = re.compile(r"^\|\s*`([A-Z_]+)`\s*\|([^|]*)\|")
_CODE = re.compile(r"^`([^`]*)`$")


def readme_table() -> dict[str, str]:
    """{variable: default cell} of the table in docs/configuration.md."""
    rows = (_ROW.match(line) for line in TABLE.read_text().splitlines())
    return {m.group(1): m.group(2).strip() for m in rows if m}


def test_readme_lists_every_variable_settings_declares() -> None:
    declared = [name for name, *_ in Settings.variables()]
    assert len(declared) == len(set(declared)), "a variable is declared twice"
    assert sorted(readme_table()) == sorted(declared)


def test_readme_defaults_are_the_settings_defaults() -> None:
    """A default written as `code` in the table parses to the field's default; a default in
    words (such as "half of the worker's concurrency") is only required to be there."""
    table = readme_table()
    for name, _, parse, default in Settings.variables():
        cell = table[name]
        assert cell, f"{name}: the README states no default"
        if (code := _CODE.match(cell)) is not None:
            assert parse(name, code.group(1)) == default, f"{name}: README says {cell}"
        elif cell == "unset":
            assert default is None, f"{name}: README says unset, Settings has {default!r}"
    assert Settings.from_env({}) == Settings()


def test_blank_variables_keep_their_defaults() -> None:
    env = {name: " " for name, *_ in Settings.variables()}
    assert Settings.from_env(env) == Settings()


@pytest.mark.parametrize(("name", "value", "message"), [
    ("WEBHOOKS_ALLOW_PRIVATE_TARGETS", "maybe", "must be true or false"),
    ("WEBHOOKS_RETRY_SCHEDULE", " , ", "WEBHOOKS_RETRY_SCHEDULE: WEBHOOKS_RETRY_SCHEDULE is empty"),
    ("WEBHOOKS_RETRY_SCHEDULE", "5s,soon", "WEBHOOKS_RETRY_SCHEDULE: not a duration: 'soon'"),
    ("WEBHOOKS_RETENTION", "a week", "WEBHOOKS_RETENTION: not a duration"),
    ("WEBHOOKS_LEASE", "0.5", "WEBHOOKS_LEASE must be at least 1"),
    ("WEBHOOKS_POLL_INTERVAL", "often", "WEBHOOKS_POLL_INTERVAL must be a number"),
    ("WEBHOOKS_POOL_SIZE", "2.5", "WEBHOOKS_POOL_SIZE must be a whole number"),
    ("WEBHOOKS_CONCURRENCY", "inf", "WEBHOOKS_CONCURRENCY must be a whole number"),
    ("WEBHOOKS_LOG_FORMAT", "xml", "WEBHOOKS_LOG_FORMAT must be text or json"),
    ("DATABASE_URL", "localhost:5432", "DATABASE_URL is not a PostgreSQL URI"),
    ("DATABASE_URL", "postgresql://u:hunter2@[::1", "DATABASE_URL is not a valid PostgreSQL URI"),
])
def test_a_bad_value_names_its_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings.from_env({name: value})


def test_values_are_parsed() -> None:
    settings = Settings.from_env({
        "WEBHOOKS_ALLOW_PRIVATE_TARGETS": "Yes", "WEBHOOKS_RETRY_SCHEDULE": "250ms, 1m,",
        "WEBHOOKS_RETENTION": "1d", "WEBHOOKS_DNS_SERVERS": "10.0.0.1, 10.0.0.2:53,",
        "WEBHOOKS_LOG_LEVEL": "debug", "WEBHOOKS_BATCH_SIZE": "7.0"})
    assert settings.allow_private_targets is True
    assert settings.retry_schedule == (0.25, 60.0)
    assert settings.retention == 86400.0
    assert settings.dns_servers == ("10.0.0.1", "10.0.0.2:53")
    assert settings.log_level == "DEBUG"
    assert settings.batch_size == 7


def test_settings_from_env() -> None:
    settings = Settings.from_env({
        "WEBHOOKS_MAX_BODY_BYTES": "1024", "WEBHOOKS_MAX_SUBSCRIPTIONS_PER_OWNER": "5",
        "WEBHOOKS_MAX_EVENTS_PER_SUBSCRIPTION": "3", "WEBHOOKS_MAX_TARGET_LENGTH": "300",
        "WEBHOOKS_RATE_LIMIT": "2.5", "WEBHOOKS_RATE_BURST": "7"})
    assert (settings.max_body_bytes, settings.max_subscriptions_per_owner,
            settings.max_events_per_subscription, settings.max_target_length,
            settings.rate_limit, settings.rate_burst) == (1024, 5, 3, 300, 2.5, 7)
    defaults = Settings.from_env({})
    assert (defaults.max_body_bytes, defaults.max_subscriptions_per_owner,
            defaults.max_events_per_subscription, defaults.max_target_length,
            defaults.rate_limit, defaults.rate_burst) == (65536, 1000, 100, 2048, 100.0, 200)
    assert Settings.from_env({"WEBHOOKS_RATE_LIMIT": "0"}).rate_limit == 0
    for name, bad in (("WEBHOOKS_MAX_BODY_BYTES", "0"), ("WEBHOOKS_RATE_LIMIT", "-1"),
                      ("WEBHOOKS_MAX_SUBSCRIPTIONS_PER_OWNER", "1.5"),
                      ("WEBHOOKS_RATE_BURST", "many")):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: bad})


def test_the_owner_bounds_have_their_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.max_filter_bytes_per_owner == 262144
    assert settings.max_page_bytes == 1048576
    assert Settings.from_env({"WEBHOOKS_MAX_PAGE_BYTES": "5000"}).max_page_bytes == 5000


# The per-owner cap at work in a worker: tests/e2e/test_owner_caps.py.
def test_per_owner_setting() -> None:
    assert Settings().per_owner_concurrency is None  # half of the worker's slots
    settings = Settings.from_env({"WEBHOOKS_PER_OWNER_CONCURRENCY": "3"})
    assert settings.per_owner_concurrency == 3
    with pytest.raises(ConfigError, match="WEBHOOKS_PER_OWNER_CONCURRENCY"):
        Settings.from_env({"WEBHOOKS_PER_OWNER_CONCURRENCY": "0"})


# Lookups bounded by the timeout, against a name server that never answers:
# tests/e2e/test_dns.py.
def test_dns_settings() -> None:
    assert Settings().dns_timeout == 5.0 and Settings().dns_servers == ()
    settings = Settings.from_env({"WEBHOOKS_DNS_TIMEOUT": "2",
                                  "WEBHOOKS_DNS_SERVERS": "10.0.0.53, 10.0.0.54:5353"})
    assert settings.dns_timeout == 2.0
    assert settings.dns_servers == ("10.0.0.53", "10.0.0.54:5353")
    with pytest.raises(ConfigError, match="WEBHOOKS_DNS_TIMEOUT"):
        Settings.from_env({"WEBHOOKS_DNS_TIMEOUT": "0"})


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return make_tls(tmp_path)


def test_the_ca_bundle_setting_must_be_a_pem_file(tls: TlsFiles, tmp_path: Path) -> None:
    settings = Settings.from_env({"WEBHOOKS_CA_BUNDLE": str(tls.ca)})
    assert settings.ca_bundle == str(tls.ca)
    with pytest.raises(ConfigError, match="WEBHOOKS_CA_BUNDLE: cannot read"):
        Settings.from_env({"WEBHOOKS_CA_BUNDLE": str(tmp_path / "missing.pem")})
    with pytest.raises(ConfigError, match="holds no PEM certificate"):
        Settings.from_env({"WEBHOOKS_CA_BUNDLE": str(tls.key)})
