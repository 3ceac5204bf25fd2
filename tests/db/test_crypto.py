"""Secrets at rest: Fernet encryption, key rotation and the re-seal command."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from service.config import ConfigError, Settings
from service.crypto import PREFIX, SecretBox, SecretsError, new_key, reseal_all
from tests.support.subscriptions import subscribe


def test_seal_and_open_round_trip() -> None:
    box = SecretBox(new_key())
    sealed = box.seal("whsec_abc")
    assert sealed.startswith(PREFIX) and "whsec_abc" not in sealed
    assert box.open(sealed) == "whsec_abc"
    assert box.open("whsec_plain") == "whsec_plain"  # rows stored before a key was set


def test_without_a_key_secrets_stay_plain_and_sealed_ones_fail_clearly() -> None:
    box = SecretBox(None)
    assert box.seal("whsec_abc") == "whsec_abc"
    with pytest.raises(SecretsError, match="WEBHOOKS_ENCRYPTION_KEY is not set"):
        box.open(SecretBox(new_key()).seal("whsec_abc"))
    with pytest.raises(SecretsError, match="does not decrypt"):
        SecretBox(new_key()).open(SecretBox(new_key()).seal("whsec_abc"))


def test_a_malformed_key_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="Fernet"):
        Settings.from_env({"WEBHOOKS_ENCRYPTION_KEY": "not-a-key"})


def test_rotation_keeps_old_rows_readable() -> None:
    old, new = new_key(), new_key()
    sealed_old = SecretBox(old).seal("whsec_abc")
    rotated = SecretBox(f"{new},{old}")
    assert rotated.open(sealed_old) == "whsec_abc"
    resealed = rotated.reseal(sealed_old)
    assert resealed is not None and SecretBox(new).open(resealed) == "whsec_abc"
    assert rotated.reseal(resealed) is None


def secrets_in_table(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT secret FROM webhooks.subscriptions ORDER BY id")]


def test_reseal_all_encrypts_every_row_and_back(conn: psycopg.Connection) -> None:
    plain = [f"whsec_secret{i}" for i in range(7)]
    for secret in plain:
        subscribe(conn, "http://x/", owner="o", events=["invoice.create"], secret=secret)
    key = new_key()
    assert reseal_all(conn, key, batch=3, progress=None) == (7, 7)
    stored = secrets_in_table(conn)
    assert not any(s.startswith("whsec_") or "secret" in s for s in stored)
    assert [SecretBox(key).open(s) for s in stored] == plain
    assert reseal_all(conn, key, batch=3, progress=None) == (0, 7)
    with pytest.raises(SecretsError, match="not set"):
        reseal_all(conn, None, progress=None)


def test_secrets_command_shows_progress(db_url: str, conn: psycopg.Connection) -> None:
    subscribe(conn, "http://x/", owner="o", events=["invoice.create"], secret="whsec_s")
    env = {**os.environ, "DATABASE_URL": db_url, "WEBHOOKS_ENCRYPTION_KEY": new_key()}
    out = subprocess.run([sys.executable, "-m", "service", "secrets", "encrypt"], env=env,
                         capture_output=True, text=True, check=True)
    assert "1/1 secrets checked, 1 re-sealed" in out.stderr
    assert "re-sealed 1 of 1" in out.stdout
    assert secrets_in_table(conn)[0].startswith(PREFIX)
