"""API tokens: random, shown once, stored as SHA-256 hashes, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from service.store import Store, SyncStore

PREFIX = "wht_"
_FORM = re.compile(r"^wht_[A-Za-z0-9_-]{43}$")


@dataclass(frozen=True)
class Principal:
    """Who a valid token speaks for."""

    token_id: int
    owner: str
    tenant: str | None


def new_token() -> str:
    """A fresh token: the prefix and 256 random bits, URL-safe base64."""
    return PREFIX + secrets.token_urlsafe(32)


def well_formed(token: str) -> bool:
    """Whether the string has the shape of a token this service issues."""
    return bool(_FORM.match(token))


def hash_token(token: str) -> bytes:
    """The stored form of a token."""
    return hashlib.sha256(token.encode()).digest()


def create(conn: psycopg.Connection, owner: str, tenant: str | None = None) -> tuple[int, str]:
    """Stores a new token for `owner` (and `tenant`); returns its id and the token itself."""
    if not owner.strip():
        raise ValueError("owner must not be empty")
    if tenant is not None and not tenant.strip():
        raise ValueError("tenant must not be empty when given")
    token = new_token()
    token_id = SyncStore(conn).insert_token(owner=owner, tenant=tenant,
                                            token_hash=hash_token(token))
    return token_id, token


def list_all(conn: psycopg.Connection) -> list[dict[str, object]]:
    """Every token's id, owner, tenant and dates; never the token."""
    return list(SyncStore(conn).list_tokens())


def revoke(conn: psycopg.Connection, token_id: int) -> bool:
    """Revokes the token; False when no token has that id."""
    return SyncStore(conn).revoke_token(id=token_id)


async def authenticate(store: Store, token: str) -> Principal | None:
    """The principal of a valid, unrevoked token, else None."""
    if not well_formed(token):
        return None
    digest = hash_token(token)
    return principal_of(await store.lookup_token(token_hash=digest), digest)


def principal_of(row: Sequence[Any] | None, digest: bytes) -> Principal | None:
    """The principal of a token row looked up by `digest` (id, owner, tenant, hash first),
    or None when there is none."""
    # The lookup is by hash, so timing reveals nothing of the token; compare again in
    # constant time so that no future change of the lookup can make it leak.
    if row is None or not hmac.compare_digest(bytes(row[3]), digest):
        return None
    return Principal(token_id=int(row[0]), owner=str(row[1]), tenant=row[2])
