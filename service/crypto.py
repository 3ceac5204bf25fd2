"""Subscription secrets at rest: Fernet-encrypted when WEBHOOKS_ENCRYPTION_KEY is set.

Stored values are either the secret itself (`whsec_...`, no key configured) or
`fernet:<token>`. Several comma-separated keys may be configured: the first encrypts,
all decrypt, so keys can be rotated with `webhooks secrets encrypt`.
"""

from __future__ import annotations

import sys
from typing import TextIO

import psycopg
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from service.store import SyncStore

PREFIX = "fernet:"


class SecretsError(RuntimeError):
    """A stored secret cannot be read with the configured keys."""


class SecretBox:
    """Encrypts and decrypts subscription secrets with the configured keys (if any)."""

    def __init__(self, keys: str | None) -> None:
        parts = [k.strip() for k in (keys or "").split(",") if k.strip()]
        try:
            self._keys = [Fernet(k) for k in parts]
        except ValueError:
            raise ValueError("WEBHOOKS_ENCRYPTION_KEY must be one or more comma-separated "
                             "Fernet keys (generate one with `webhooks secrets keygen`)"
                             ) from None
        self._fernet = MultiFernet(self._keys) if self._keys else None

    @property
    def enabled(self) -> bool:
        """Whether new secrets are stored encrypted."""
        return self._fernet is not None

    def seal(self, secret: str) -> str:
        """The form to store: encrypted when a key is configured."""
        if self._fernet is None:
            return secret
        return PREFIX + self._fernet.encrypt(secret.encode()).decode()

    def open(self, stored: str) -> str:
        """The secret of a stored value, whichever form it is in."""
        if not stored.startswith(PREFIX):
            return stored
        if self._fernet is None:
            raise SecretsError("a subscription secret is encrypted but WEBHOOKS_ENCRYPTION_KEY "
                               "is not set")
        try:
            return self._fernet.decrypt(stored[len(PREFIX):].encode()).decode()
        except InvalidToken:
            raise SecretsError("a subscription secret does not decrypt with "
                               "WEBHOOKS_ENCRYPTION_KEY") from None

    def reseal(self, stored: str) -> str | None:
        """The value to store instead, under the current first key; None when already so."""
        secret = self.open(stored)
        if not self._keys:
            return None if stored == secret else secret
        if stored.startswith(PREFIX):
            try:
                self._keys[0].decrypt(stored[len(PREFIX):].encode())
                return None
            except InvalidToken:
                pass
        return self.seal(secret)


def new_key() -> str:
    """A fresh Fernet key."""
    return Fernet.generate_key().decode()


def reseal_all(conn: psycopg.Connection, keys: str | None, batch: int = 500,
               progress: TextIO | None = sys.stderr) -> tuple[int, int]:
    """Re-stores every subscription secret in the form `keys` ask for; (changed, total)."""
    box = SecretBox(keys)
    store = SyncStore(conn)
    total = store.count_secrets()
    changed = seen = 0
    after = 0
    while True:
        with conn.transaction():
            rows = store.secrets_batch(after=after, limit=batch)
            if not rows:
                break
            updates = [(new, sid) for sid, stored in rows
                       if (new := box.reseal(stored)) is not None]
            if updates:
                store.update_secrets([(sid, new) for new, sid in updates])
        changed += len(updates)
        seen += len(rows)
        after = int(rows[-1][0])
        if progress is not None:
            print(f"\r{seen}/{total} secrets checked, {changed} re-sealed", end="",
                  file=progress, flush=True)
    if progress is not None and seen:
        print(file=progress)
    return changed, seen
