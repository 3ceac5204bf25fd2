"""Subscriptions' plain secrets, kept in memory: decrypting is far slower than signing."""

from __future__ import annotations

from service.crypto import SecretBox

# Plain secrets kept in memory at most, keyed by their stored (maybe encrypted) form.
SECRET_CACHE = 10_000


class SecretCache:
    """Opens stored secrets with `box`, each once while it stays in the cache."""

    def __init__(self, box: SecretBox, size: int = SECRET_CACHE) -> None:
        self._box = box
        self._size = size
        self._plain: dict[str, str] = {}

    def open(self, stored: str) -> str:
        """The plain secret of `stored`; raises SecretsError as SecretBox.open does."""
        secret = self._plain.get(stored)
        if secret is None:
            if len(self._plain) >= self._size:
                self._plain.clear()
            secret = self._plain[stored] = self._box.open(stored)
        return secret
